"""Where the ranks parted: the first op at which their event streams stopped lining up
(`align`), the statement in the program that split them, read with `ast` from the user's
source (`source`, `arms`, `branch` with `callee`, `loops`, `conditions`, `order`), who
strayed (`blame`), and a mismatch or hang said at that root (`parted`).

Layer: detectors (tests/test_layers.py), part of distdoctor.diagnosis: May import the
rendezvous (diagnosis/rendezvous.py), the mismatch detectors (diagnosis/mismatches) and what
the diagnosis package may import.
"""
