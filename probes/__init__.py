"""Hardware and system probes (NVML, psutil, py-spy), installed as `distdoctor.probes`.

The node sampler (`sampler.py`: host, rank processes and GPUs at 1 Hz, written to
RUN_DIR/probes/), every NVML call through one module (`nvml.py`, `nvml_values.py`,
`nvml_replay.py` for recorded readings), the ranks' stacks (`stacks.py`) and their
progress read from /proc (`progress.py`), and NVIDIA's Xid events (`xids.py`: the
driver's format and what each means). What the readings mean is the detectors' part
(diagnosis/hangs/progress.py, diagnosis/stragglers/throttle.py).

Layer: sensors (tests/test_layers.py). May import the base modules only (errors,
priority). The tracer and the detectors import the probes, guarded, never the other
way round.
"""
