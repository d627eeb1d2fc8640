"""The rank side: every collective that reaches a process group, written to the rank's
event log with plain stores (`process_group.py`, `recorder.py`, its C hot path in the
run log's extension `runlog/_fast.c`, `opfields.py`, `callsite.py`, `sites.py`,
`completion.py`, `work.py`, `steps.py`), the op table per torch release (`ops.py`,
`support.py`) and the hooks that arm it (`install.py`).

Layer: sensors (tests/test_layers.py). May import the run log (the event log's format and
writer), the probes (the stack dump handler, guarded) and the base modules. Never a
detector, a view or a front end: this runs inside the user's job.
"""
