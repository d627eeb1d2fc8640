"""Mismatches: ranks that meet at the same collective or p2p pairing but disagree on
it (`mismatch`), what the job prints after one (`after_mismatch`), and one process group
used from two user threads of a rank (`threads`).

Layer: detectors (tests/test_layers.py), part of distdoctor.diagnosis: May import the
rendezvous (diagnosis/rendezvous.py) and what the diagnosis package may import.
"""
