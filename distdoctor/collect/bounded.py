"""Tables a collector keeps per collective, bounded: a node or rank that never reports a
collective's end must not grow them without end."""

from __future__ import annotations


def entry(table: dict, key, cap: int, make):
    """table[key], made by `make()` when missing; making one in a full table lets the
    oldest go first (dicts keep insertion order: the one a member never came to)."""
    found = table.get(key)
    if found is None:
        if len(table) >= cap:
            del table[next(iter(table))]
        found = table[key] = make()
    return found
