"""Numbers a peer sends, bounded in one place before the collector keeps any of them.

JSON names numbers without a bound: `1e999` and `Infinity` read as float infinity, NaN
compares false with everything, and `-1` followed by 400 zeros is a Python int that no
float holds. Each of them, kept, raised later and far from the frame that brought it:
`int(inf)` when an op was decoded, `x / 1e9` of a 400-digit int when a wait was measured,
on the collector's diagnosis thread or in /metrics, for every frame after. So every
number a decoder takes from a peer passes one of these checks as the frame is read, and a
frame with one that fails is refused whole (the peer is dropped with one line).

Every bound is within a signed 64-bit word (what a rank's event log holds): sums and
differences of a few million such numbers, and their conversion to float, never overflow.
Floats must be finite (the comparisons below are false for NaN and the infinities).
"""

from __future__ import annotations

import json
import math
import re

INT64 = 1 << 63  # integers are in [-INT64, INT64)
# seconds and milliseconds a node reports (ages, step times, lateness): 30,000 years
MAX_SECONDS = 1e12
_INT = {int}
# Text where a JSON number may be out of bounds: an int of 19 digits or more (2^63 has
# 19), a float whose exponent has 3 digits (past 1e308: infinity), Infinity, NaN. Text
# without one (nearly every frame) needs no parse to know its numbers are within bounds.
_SUSPECT = re.compile(r"Infinity|NaN|\d{19}|[eE][+-]?\d{3}")


def is_int(x, lo: int = -INT64, hi: int = INT64) -> bool:
    """An int (not a bool) in [lo, hi)."""
    return type(x) is int and lo <= x < hi


def is_count(x) -> bool:
    """An int in [0, INT64): an event number, a count of elements or ops, a wait in ns."""
    return type(x) is int and 0 <= x < INT64


def ints_within(items, lo: int, hi: int) -> bool:
    """Every item an int (not a bool) in [lo, hi). A long list (a group's thousands of
    members) at C speed: its set of types, its min and max; a short one in a loop (the
    set alone costs more than a few items' checks)."""
    if len(items) > 16:
        return set(map(type, items)) == _INT and lo <= min(items) and max(items) < hi
    for x in items:
        if type(x) is not int or not lo <= x < hi:
            return False
    return True


def digits(text, most: int = 18) -> bool:
    """A JSON key that names a number: ASCII digits, at most `most` of them (str.isdigit
    takes other scripts' digits and 5,000 of them, which int() refuses with ValueError)."""
    return isinstance(text, str) and 0 < len(text) <= most and text.isascii() and text.isdigit()


def kept_number(value):
    """A number from a peer's free-form JSON (a finding's details), as the collector keeps
    it: None when it is a non-finite float or an int outside [-INT64, INT64), so
    findings.json stays JSON any reader takes (no bare Infinity) and prints as a number."""
    if type(value) is float and not math.isfinite(value):
        return None
    if type(value) is int and not -INT64 <= value < INT64:
        return None
    return value


def numbers_within(value) -> bool:
    """Every number in a JSON value (a node's metadata, its launch identity, a probe
    sample) finite and an int within 64 bits; False too for one nested past Python's
    recursion limit."""
    try:
        return _within(value)
    except RecursionError:
        return False


def _within(value) -> bool:
    kind = type(value)
    if kind is float:
        return math.isfinite(value)
    if kind is int:
        return -INT64 <= value < INT64
    if kind is list:
        return all(_within(v) for v in value)
    if kind is dict:
        return all(_within(v) for v in value.values())
    return True


def lines_within(text: str) -> bool:
    """numbers_within for each JSON line of `text` (a SAMPLES frame: a line that is no
    JSON is no sample, and every reader passes it over); parsed only when the text holds
    a number that may be out of bounds (_SUSPECT), else a regex's scan."""
    if not _SUSPECT.search(text):
        return True
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not numbers_within(value):
            return False
    return True
