"""The run directory: what the tracer writes and every front end reads.

`format` fixes the bytes, `ring` writes a rank's event log from inside the job,
`reader` and `rundir` read a run back (live or post-mortem).
"""
