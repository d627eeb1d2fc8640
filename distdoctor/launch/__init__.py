"""`distdoctor run`'s processes: the job's local ranks or its wrapped launcher
(`local.py`), the environment and the `sitecustomize` that arm the tracer in every Python
process of the job (`env.py`, `bootstrap/`), `run` in the background (`background.py`),
and the reaper and the guardian that leave no process of the job behind (`reaper.py`,
`guardian.py`: standard library only, so the guardian starts in milliseconds).

Layer: front ends (tests/test_layers.py). May import the tracer (the bootstrap installs
it), the run log and the base modules; the other front ends import it to start jobs.
"""
