"""What the log tests share (test_logs_*.py): the findings a person is warned of, and a
log written into the test's own directory."""

from __future__ import annotations

import json
from pathlib import Path


def warned_of(found) -> list:
    """The findings `diagnose --log` warns of (errors and warnings), not its notes."""
    return [f for f in found if f.severity in ("error", "warning")]


def write_named(tmp_path: Path, name: str, text: str) -> str:
    """`text` as the log file `name` in `tmp_path`; its path."""
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def says_what_its_sidecar_expects(log: Path) -> str:
    """A fixture log judged against the `expect` of the .json beside it: serious or not,
    the words its warnings say (and do not), the ranks they name, the first one's remedy.
    Returns the read line `diagnose --log` prints about the log."""
    from distdoctor.logs import scan_logs

    expect = json.loads(log.with_suffix(".json").read_text())["expect"]
    found, read = scan_logs([str(log)])
    loud = warned_of(found)
    assert bool(loud) == expect["serious"], [f.summary for f in found]
    text = " ".join(f.summary for f in loud)
    for word in expect["words"]:
        assert word in text, text
    for word in expect.get("not_words", []):
        assert word not in text, text
    assert sorted({r for f in loud for r in f.ranks}) == expect["ranks"], text
    if "remedy" in expect:
        assert expect["remedy"] in (loud[0].remedy or ""), loud[0].remedy
    return read
