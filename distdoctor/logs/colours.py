"""Colour codes in a line of output: ANSI escapes as terminals get them, and the same codes
with their ESC byte lost in a copy ("[36m(Worker pid=1)[0m "), both peeled before prefixes
are read. A line with a code in it hides its prefixes from every rule until then."""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
# SGR colour codes whose ESC byte was lost in a copy (a web page, a CI viewer, `less` without
# -R): "[36m(WorkerDict pid=1, ip=..)[0m ", "[1;31mERROR[0m". Only "m" codes of at most three
# numbers: "[5m]" (a duration in brackets) is text, so a "]" right after is no code.
_LOST_ESC = re.compile(r"\[\d{1,3}(?:;\d{1,3}){0,4}m(?!\])")


def strip_ansi(s: str) -> str:
    if "\x1b" in s:
        s = ANSI.sub("", s)
    return strip_lost_escapes(s)


def strip_lost_escapes(s: str) -> str:
    """`s` without the colour codes whose ESC was lost ("[36m", "[0m"). A coloured line nearly
    always resets ("[0m") or starts with its colour: only then is the regex run (the cheap
    tests keep it off the hot path's plain lines)."""
    if "[0m" in s or s[:1] == "[" and s[1:2].isdigit() and _LOST_ESC.match(s):
        return _LOST_ESC.sub("", s)
    return s
