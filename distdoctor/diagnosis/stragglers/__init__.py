"""Stragglers and their causes: per-rank, per-step accounting (`steptime`, `stepstats`),
the per-step wait-for graph (`waitgraph`), the rank the others keep waiting for
(`straggler`), why it is late (`cause`: its own work, or the machine's noise in
`host_noise`), and a GPU slowed down by heat, power or hardware (`throttle`).

Layer: detectors (tests/test_layers.py), part of distdoctor.diagnosis: May import the
rendezvous and what the diagnosis package may import.
"""
