"""Crashes: a rank whose process died and the ranks left waiting for it (`crash`), and the
phase it died in: its step, before the first or after the last (`phase`).

Layer: detectors (tests/test_layers.py), part of distdoctor.diagnosis: May import the hangs
(diagnosis/hangs), where the ranks parted (diagnosis/parting) and what the diagnosis package
may import.
"""
