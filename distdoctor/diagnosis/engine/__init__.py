"""The diagnosis engine: event streams in, findings out, live and post-mortem alike
(`core`); its book of findings (`book`), its pass over hangs (`hangs`), its judgement of
waits (`waits`), and the boundary that keeps one failing detector from stopping the
others (`boundary`); what it keeps of each rank (`ranks`).

Layer: detectors (tests/test_layers.py), part of distdoctor.diagnosis: May import every
detector of the diagnosis package (its sub-packages and diagnosis/rendezvous.py) and what
the diagnosis package may import; never its drivers (diagnosis/live.py,
diagnosis/postmortem.py).
"""
