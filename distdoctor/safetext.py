"""Text that came from elsewhere (a node, a rank, a log, a peer), made safe to print.

A peer's words reach an operator's terminal: a finding's summary forwarded by a node, a
collector's refusal reason, an exception string a rank wrote into its log, a line of a
job's output. Printed raw, an escape sequence in them clears the screen, retitles the
window or rewrites what was printed before; printed through rich, a `[/x]` in them is
markup (and a MarkupError). So everything foreign passes through here first: escape
sequences removed whole, every other control character (C0, DEL, C1, bidirectional)
replaced, and the length bounded. No import of distdoctor: every layer may use it.
"""

from __future__ import annotations

import re

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), and two-character escapes. Linear:
# each quantifier ranges over a class that cannot match what follows it.
_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]?|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_]?)")
# C0, DEL, C1, and the bidirectional controls (embeddings, overrides, isolates, the marks):
# these reorder what the terminal shows ("Trojan Source": a summary that reads other than
# it says). Zero-width joiners stay: scripts and emoji need them, and they reorder nothing.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
DEFAULT_LIMIT = 2000


def printable(text, limit: int = DEFAULT_LIMIT, keep_newlines: bool = False) -> str:
    """`text` (any value: str() of it) with escape sequences removed, other control
    characters (bidirectional ones too) shown as `?` (a tab as a space; newlines kept
    only if asked), and cut to `limit` characters with an ellipsis."""
    s = text if isinstance(text, str) else str(text)
    if len(s) > 4 * limit:  # bound the work before the regexes see it
        s = s[:4 * limit]
    if "\x1b" in s:
        s = _ESCAPE.sub("", s)
    s = s.replace("\t", " ")
    if keep_newlines:
        s = "\n".join(_CONTROL.sub("?", part) for part in s.replace("\r\n", "\n").split("\n"))
    else:
        s = _CONTROL.sub("?", s)
    return s if len(s) <= limit else s[:limit - 1] + "…"


def for_rich(text, limit: int = DEFAULT_LIMIT, keep_newlines: bool = False) -> str:
    """printable(), then rich's markup escaped: for a string printed by a rich console
    with markup on (a `[/x]` from a peer is then text, never a tag)."""
    from rich.markup import escape

    return escape(printable(text, limit, keep_newlines))
