"""Issue 35's recorded scenarios (record.py runs them beside scenarios.py's): torchelastic
restarts with --max-restarts, DDP's "marked as ready twice", a distributed checkpoint that
cannot be written, a torch.compile backend that raises, Ray actors that die or raise. The
ground truth for each, as in scenarios.py."""

from scenario_spec import TORCHRUN, Scenario, crash

WIDE = "tests/jobs/logfail/wide_worker.py"
RAY = "tests/jobs/logfail/ray_job.py"


def elastic(nproc: int, args: str) -> str:
    """torchrun with one restart and a c10d rendezvous ({port} filled in by record.py)."""
    return (f"{TORCHRUN} --nproc-per-node {nproc} --max-restarts 1 --rdzv-backend c10d "
            f"--rdzv-endpoint 127.0.0.1:{{port}} {WIDE} {args}")


SCENARIOS_WIDE = [
    Scenario(
        "elastic_restart_fails_again",
        elastic(2, "restart_fails --victim 1"),
        "Rank 1 raises OSError on the first attempt; torchelastic (--max-restarts 1, printed at "
        "INFO) restarts the group, which fails again: the first failure is the cause, the "
        "restart is said.",
        crash("exception", [1], ["OSError", "restarted"]),
        env={"LOGLEVEL": "INFO"},
        must=("attempts left", "OSError"),
    ),
    Scenario(
        "elastic_restart_recovers",
        elastic(2, "restart_recovers --victim 1"),
        "Rank 1 is SIGKILLed before it joins on the first attempt; torchelastic restarts the "
        "group and it trains to the end: the SIGKILL is reported as a warning, with the "
        "restart it cost.",
        {"kind": "crash", "family": "oom", "ranks": [1], "words": ["SIGKILL", "ran on"],
         "quiet": False},
        env={"LOGLEVEL": "INFO"},
        must=("attempts left", "training done"),
    ),
    Scenario(
        "ddp_marked_ready_twice",
        f"{TORCHRUN} --nproc-per-node 2 --master-port {{port}} {WIDE} ready_twice",
        "Two reentrant checkpoints over the same layer under DDP(find_unused_parameters=True): "
        "every rank raises 'Expected to mark a variable ready only once' (marked as ready "
        "twice) in backward.",
        crash("startup", [0, 1], ["mark a variable ready only once"]),
        must=("marked as ready twice",),
    ),
    Scenario(
        "dcp_checkpoint_exception",
        f"{TORCHRUN} --nproc-per-node 2 --master-port {{port}} {WIDE} checkpoint_unwritable",
        "torch.distributed.checkpoint.save under a path whose parent is a file: every rank "
        "raises CheckpointException gathering each rank's NotADirectoryError.",
        crash("startup", [0, 1], ["CheckpointException"]),
        must=("CheckpointException",),
    ),
    Scenario(
        "compile_backend_failed",
        f"{TORCHRUN} --nproc-per-node 2 --master-port {{port}} {WIDE} "
        "compile_backend_raises --victim 1",
        "torch.compile's backend raises on rank 1: dynamo's BackendCompilerFailed (its name "
        "ends in neither Error nor Exception) with the backend's ValueError on the next line; "
        "rank 0 then loses its gloo peer.",
        crash("exception", [1], ["BackendCompilerFailed", "cannot lower"]),
        must=("BackendCompilerFailed",),
    ),
    Scenario(
        "ray_actor_killed",
        f"python {RAY} kill",
        "Two Ray actors form a gloo group; rank 1's process is SIGKILLed mid all_reduce: the "
        "raylet reports the worker (pid, ip) dead with SYSTEM_ERROR; the driver re-raises "
        "rank 0's 'Connection reset by peer'.",
        {"kind": "crash", "family": "ray", "ranks": [], "words": ["Ray worker", "died"],
         "quiet": False},
        timeout=120,
        must=("A worker died or was killed",),
    ),
    Scenario(
        "ray_actor_raises",
        f"python {RAY} raise",
        "Two Ray actors form a gloo group; rank 1 raises RuntimeError in its task: the driver "
        "re-raises it as RayTaskError(RuntimeError) with the worker's traceback.",
        crash("exception", [], ["reward model returned NaN"]),
        timeout=120,
        must=("RayTaskError",),
    ),
    Scenario(
        "mp_spawn_rank_exits",
        "python tests/jobs/sys_exit_early.py 1 --spawn",
        "torch.multiprocessing.spawn, 2 processes: rank 1 calls sys.exit(1) in its data "
        "helper at step 5; rank 0 loses its gloo peer in the all_reduce, and the parent "
        "raises ProcessExitedException (process 1 terminated with exit code 1), which is the "
        "launcher's report of rank 1, not an error of the program's.",
        crash("launcher", [1], ["rank 1", "exited with code 1"]),
        env={"SPAWN_PORT": "{port}"},
        must=("ProcessExitedException",),
    ),
    Scenario(
        "mp_spawn_rank_raises",
        "python tests/jobs/sys_exit_early.py raise --spawn",
        "torch.multiprocessing.spawn, 2 processes: rank 1 raises ValueError in its data "
        "helper at step 5; the parent raises ProcessRaisedException, whose message is the "
        "line '-- Process 1 terminated with the following error:' and rank 1's traceback, "
        "with no rank prefix.",
        crash("exception", [1], ["ValueError", "shard 1 has no batch"]),
        env={"SPAWN_PORT": "{port}"},
        must=("ProcessRaisedException",),
    ),
]
