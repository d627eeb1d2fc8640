"""Exports of a run directory to other tools' formats.

`perfetto`: a Chrome Trace Event JSON timeline for ui.perfetto.dev (and chrome://tracing) —
one process per rank, one track per process group, ops as slices, findings as instant events.
"""

from distdoctor.export.perfetto import ExportStats, trace_events, write_perfetto

__all__ = ["ExportStats", "trace_events", "write_perfetto"]
