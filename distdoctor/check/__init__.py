"""`distdoctor check`: the pre-launch check of a job's nodes, ranks and links.

A short job runs on the ranks the training job will use (`rank.py`): each rank gathers
what it can see of itself (`facts.py`: versions, NCCL/gloo settings, limits, memory,
disks, its device, its node's GPUs) and the ranks test their links together (`links.py`:
an all-reduce whose answer is known, the clock offsets, a pairwise bandwidth sweep). The
facts of every rank reach every node; `rules.py` (and `settings.py` for the NCCL/gloo
variables) judge them into rows of one table (`table.py`); `preflight.py` checks the
rendezvous before anything starts.

Layer: front ends (tests/test_layers.py). May import the launcher (to start the check's
job), the bandwidth sweep's pieces (nccltest: its collectives helpers, the pairwise sweep
and its report), the detectors (the job-output reader for a failed check job, the
report's rank ranges), the probes (NVML), the tracer's table of supported torch releases
and the base modules.
"""
