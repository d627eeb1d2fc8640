"""PyTorch's Flight Recorder dumps: finding one set by prefix and reading each safely
(`files`), and turning them into event streams the engine reads (`dumps`).

Layer: detectors (tests/test_layers.py), part of distdoctor.diagnosis: May import the hangs'
stack reader (diagnosis/hangs/stackframes.py) and what the diagnosis package may import.
"""
