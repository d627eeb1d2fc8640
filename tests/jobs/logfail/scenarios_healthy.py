"""Recorded scenarios (scenarios.py) of healthy runs, whose logs must give no finding; and
the healthy run that died of SIGABRT at interpreter exit after it had finished."""

from scenario_spec import HEALTHY_NOT, HERE, Scenario, crash, torchrun

HEALTHY = [
    # 11. healthy
    Scenario(
        "healthy",
        torchrun(4, "healthy"),
        "A healthy 4-rank DDP run of 5 steps; only torchrun's usual OMP_NUM_THREADS warning.",
        {"kind": None, "family": "healthy", "ranks": [], "words": [], "quiet": True},
        must=("training done",),
        must_not=HEALTHY_NOT,
    ),
    Scenario(
        "exit_abort_after_training",
        torchrun(4, "healthy"),
        "The healthy 4-rank DDP run finished every step, printed 'training done' and destroyed "
        "its process group; then one rank died of SIGABRT at interpreter exit ('terminate "
        "called without an active exception') and torchrun reports the job as failed.",
        crash("launcher", None, ["SIGABRT"]),
        note="A race at exit in torch 2.13.0+cpu with gloo: seen in about one healthy run in "
        "ten here; record.py reruns the healthy job until it happens (up to 15 times).",
        must=("training done", "terminate called without an active exception"),
        tries=15,
    ),
    Scenario(
        "healthy_debug_info",
        torchrun(4, "healthy"),
        "The healthy run with TORCH_DISTRIBUTED_DEBUG=INFO and TORCH_CPP_LOG_LEVEL=INFO: c10d "
        "and DDP INFO lines on every rank, nothing wrong.",
        {"kind": None, "family": "healthy", "ranks": [], "words": [], "quiet": True},
        env={"TORCH_DISTRIBUTED_DEBUG": "INFO", "TORCH_CPP_LOG_LEVEL": "INFO"},
        must=("training done",),
        must_not=HEALTHY_NOT,
    ),
    Scenario(
        "lightning_healthy",
        f"python {HERE}lightning_job.py --healthy",
        "A healthy Lightning run, 2 processes on CPU/gloo: Lightning's banner, tips, "
        "deprecation warnings and progress bar, nothing wrong.",
        {"kind": None, "family": "healthy", "ranks": [], "words": [], "quiet": True},
        timeout=120,
        must=("max_epochs=1` reached",),
        must_not=HEALTHY_NOT,
    ),
    Scenario(
        "healthy_tee",
        torchrun(4, "healthy", launcher="--tee 3"),
        "The healthy run with `--tee 3`.",
        {"kind": None, "family": "healthy", "ranks": [], "words": [], "quiet": True},
        must=("training done",),
        must_not=HEALTHY_NOT,
    ),
]
