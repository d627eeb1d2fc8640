"""Exports of a run to other tools: files and the live `/metrics` endpoint.

`perfetto`: a Chrome Trace Event JSON timeline for ui.perfetto.dev (and chrome://tracing) —
one process per rank, one track per process group, ops as slices, findings as instant events.
`flight_recorder`: one PyTorch Flight Recorder dump per rank, which torchfrtrace reads
(`fr_analyzer` runs torchfrtrace and reads its verdict, for the tests and the benchmark).
`metrics` + `metrics_http`: Prometheus families and their text at `/metrics`, from the
values views/rank_metrics.py reads.

Layer: front ends (tests/test_layers.py). May import the views, the detectors, the run
log, the API package (its version) and the collector's address parsing; never the CLI.
"""

from distdoctor.export.perfetto import ExportStats, trace_events, write_perfetto

__all__ = ["ExportStats", "trace_events", "write_perfetto"]
