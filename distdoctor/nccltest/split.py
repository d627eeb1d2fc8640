"""--split: run the sweep in parallel groups, as nccl-tests' NCCL_TESTS_SPLIT does.

    node        one group per host (intra-node links only)
    rail        one group per local index: rank i of every host (the network, one rail each)
    MOD k       color = rank % k   (NCCL_TESTS_SPLIT="MOD 8" = rail on 8-GPU nodes)
    DIV k       color = rank // k  (NCCL_TESTS_SPLIT="DIV 8" = node on 8-GPU nodes)
    AND m       color = rank & m   (NCCL_TESTS_SPLIT_MASK=m)
    OR m        color = rank | m

Ranks with the same color form a group; groups are numbered in order of their colors.
"""

from __future__ import annotations

import re

from distdoctor.errors import UserError

_RULE = re.compile(r"^\s*(MOD|DIV|AND|OR)\s*[ =:]?\s*(0[xX][0-9a-fA-F]+|[0-9]+)\s*$", re.I)


def parse_split(text: str) -> tuple[str, int]:
    """'node' -> ('node', 0); 'MOD 8' -> ('mod', 8); '0x7' -> ('and', 7)."""
    key = text.strip().lower()
    if key in ("node", "rail"):
        return key, 0
    if re.fullmatch(r"0x[0-9a-f]+", key):
        return "and", int(key, 16)
    m = _RULE.match(text)
    if not m:
        raise UserError(f"invalid --split {text!r}: use node, rail, or 'MOD k', 'DIV k', "
                        "'AND mask', 'OR mask' as in NCCL_TESTS_SPLIT", 2)
    value = int(m.group(2), 0)
    if m.group(1).upper() in ("MOD", "DIV") and value < 1:
        raise UserError(f"--split {text!r}: {m.group(1).upper()} needs a value of 1 or more", 2)
    return m.group(1).lower(), value


def colors(rule: tuple[str, int], hosts: list[str]) -> list[int]:
    """A color per global rank, from the rule and each rank's host name."""
    kind, value = rule
    if kind == "node":
        order = list(dict.fromkeys(hosts))
        return [order.index(h) for h in hosts]
    if kind == "rail":
        seen: dict[str, int] = {}
        out = []
        for h in hosts:
            out.append(seen.get(h, 0))
            seen[h] = seen.get(h, 0) + 1
        return out
    ops = {"mod": lambda r: r % value, "div": lambda r: r // value,
           "and": lambda r: r & value, "or": lambda r: r | value}
    return [ops[kind](r) for r in range(len(hosts))]


def groups(rule: tuple[str, int], hosts: list[str]) -> list[list[int]]:
    """Global ranks of each group, groups ordered by color; all must have the same size."""
    by_color: dict[int, list[int]] = {}
    for rank, color in enumerate(colors(rule, hosts)):
        by_color.setdefault(color, []).append(rank)
    out = [by_color[c] for c in sorted(by_color)]
    sizes = sorted({len(g) for g in out})
    if len(sizes) > 1:
        raise UserError(f"--split gives groups of unequal sizes ({', '.join(map(str, sizes))} "
                        "ranks); choose a rule that divides the ranks evenly", 2)
    return out
