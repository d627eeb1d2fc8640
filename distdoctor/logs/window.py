"""Where a log's window starts: a paste or an excerpt that begins mid-run shows some ranks
and not others, and a rank it does not show proves nothing (it may have printed before the
window opened). What counts as a start mid-run, from the first line the file shows (after
its prefixes): a traceback's inner lines, a report already under way, a progress bar past
0%, an error or timeout already printed, an elision ("..."). Anything else may be the job's
beginning and is taken as one.
"""

from __future__ import annotations

import re

_MID = re.compile(
    r"^(?:\s+\S|File \"|\.\.\.|During handling|The above exception|\^+\s*$|"
    r"(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Failure)\b|.*?(?:[Ww]atchdog caught|timed out|"
    r"[Tt]imeout|Traceback \(most recent call last\)))")
_BAR = re.compile(r"(\d{1,3})%\|")


def starts_mid_run(first: str) -> bool:
    """Whether a log whose first line (its message, prefixes peeled) is `first` starts
    mid-run."""
    if not first.strip():
        return False
    if (m := _BAR.search(first)) and int(m.group(1)) > 0:
        return True
    return bool(_MID.match(first))


def window_note(first: str, limit: int = 80) -> str:
    """The read summary's words for a window that starts mid-run."""
    text = first.strip()
    cut = text[:limit] + ("..." if len(text) > limit else "")
    return (f" (the log starts mid-run, at {cut!r}: a rank it does not show is not shown to "
            f"be absent)")
