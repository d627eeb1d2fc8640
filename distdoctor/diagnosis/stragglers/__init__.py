"""Stragglers and their causes: per-rank, per-step accounting (`steptime`, `stepstats`),
the per-step wait-for graph (`waitgraph`), the rank the others keep waiting for
(`straggler`), why it is late (`cause`: its own work, or the machine's noise in
`host_noise`), and a GPU slowed down by heat, power or hardware (`throttle`).

Layer: detectors (tests/test_layers.py), part of distdoctor.diagnosis: May import the
rendezvous and what the diagnosis package may import.
"""


def drop_oldest(table: dict) -> tuple:
    """Remove and return the (key, value) first put in `table` (a dict keeps the order
    its keys were put in). The per-step tables churn once per step and rank, a loop of
    one collective per iteration once per collective: an OrderedDict's own order (a
    linked node per key) doubled the cost of each put and drop (engine/_ingest.c does
    the same on the dict itself)."""
    key = next(iter(table))
    return key, table.pop(key)
