"""Views: what the front ends show of a job, as plain data taken between two passes of the
live engine (under its lock), so a front end only draws or serves it.

  snapshot.py       `JobSnapshot` (per rank, group and finding): what `watch` draws and
                    `watch --once` prints
  probe_columns.py  each rank's process and GPU columns, from the probe samples
  rank_metrics.py   what `/metrics` reports of the job: every rank, the findings, the samples
  fleet_view.py     the rows and values of the ranks whose nodes send digests
  rank.py           one rank, whoever reads its events: its row and state in words, its
                    `/metrics` values (what the three above share; imports none of them)

Layer: views (tests/test_layers.py). May import the detectors (diagnosis/, logs/,
findings.py), the sensors and the run log below them. Never imports a front end (tui/,
export/, collect/, cli/, ...) nor Textual or an HTTP server: the collector's engine is
handed in by the front end that runs it, and read here, not imported.
"""
