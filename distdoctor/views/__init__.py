"""Views: what the front ends show of a job, as plain data taken between two passes of the
live engine (under its lock), so a front end only draws or serves it.

  snapshot.py       `JobSnapshot` (per rank, group and finding): what `watch` draws and
                    `watch --once` prints
  probe_columns.py  each rank's process and GPU columns, from the probe samples
  rank_metrics.py   the values `/metrics` reports per rank, the findings, the samples
  fleet_view.py     the same rows and values for the ranks whose nodes send digests

Layer: views (tests/test_layers.py). May import the detectors (diagnosis/, logs/,
findings.py), the sensors and the run log below them. Never imports a front end (tui/,
export/, collect/, cli/, ...) nor Textual or an HTTP server: the collector's engine is
handed in by the front end that runs it, and read here, not imported.
"""
