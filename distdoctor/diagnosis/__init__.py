"""Diagnosis: detectors over the ranks' event streams, the engine that runs them, and its
two drivers.

Detectors are pure functions of the events (plus process exits and probe readings), so
the same code serves the live engine in `distdoctor run` and the post-mortem `distdoctor
diagnose`. One sub-package a kind of detector: `mismatches/`, `parting/` (where the ranks
parted, read from the program), `hangs/`, `stragglers/` (the throttle detector over the
probes' GPU readings among them), `crashes/`, `flight_recorder/` (PyTorch's dumps read into
event streams). The engine (`engine/`) runs them over the run log; the live loop (`live.py`:
a thread for `run` and `watch`) and the post-mortem pass (`postmortem.py`) drive it;
`report.py` words findings for a terminal. Imports point down that list (tests/test_layers.py,
DIAGNOSIS_PARTS).

Layer: detectors (tests/test_layers.py). May import the findings (distdoctor/findings.py),
the log reader (distdoctor/logs: the live loop's output scanner), the sensors (the probes,
optionally: each such import is guarded), the run log and the base modules. Never a view
(distdoctor/views) nor a front end.
"""
