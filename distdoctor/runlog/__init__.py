"""The run directory: what the tracer writes and every reader reads.

`format` fixes the bytes, `ring` and `slots` write a rank's event log from inside the
job (`_fast.c`: the slot writer in C, with the tracer's hot path that writes through it;
`reentry`: their locks are never taken twice by one thread, as a job's signal handler
that issues an op would),
`reader`, `follow`, `run` and `incarnations` read it back (live or post-mortem),
`rundir` owns run.json and the directory's layout.

Layer: run log (tests/test_layers.py). May import the base modules and its own C
extension (`distdoctor.runlog._fast`, which imports nothing); knows nothing of what the
events mean.
"""
