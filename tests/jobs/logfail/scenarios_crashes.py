"""Recorded scenarios (scenarios.py): a rank killed or raising, as torchrun's failure report,
the host's OOM killer and the rank's own traceback tell it; and start-up failures on
every rank."""

from scenario_spec import HERE, Scenario, crash, torchrun

CRASHES = [
    # 1. torchrun's failure report
    Scenario(
        "sigkill_rank2",
        torchrun(4, "sigkill --victim 2"),
        "Rank 2 of 4 was SIGKILLed (no traceback) at step 2; the others, waiting in all_reduce, "
        "fail with Gloo 'Connection reset by peer' (some print it before torchrun SIGTERMs "
        "them all).",
        crash("oom", [2], ["SIGKILL"], ["dmesg"]),
        must=("(SIGKILL)",),
    ),
    Scenario(
        "sigkill_rank2_tee",
        torchrun(4, "sigkill --victim 2", launcher="--tee 3"),
        "Same as sigkill_rank2 with `--tee 3`: every rank line carries torchrun's "
        "`[defaultN]:` prefix.",
        crash("oom", [2], ["SIGKILL"], ["dmesg"]),
        must=("(SIGKILL)", "[default1]:"),
    ),
    Scenario(
        "raise_then_kill",
        torchrun(4, "raise_then_kill --raiser 3 --victim 1", launcher="--monitor-interval 5"),
        "Rank 3 raised RuntimeError first (exit code 1); 1.5 s later rank 1 was SIGKILLed; torchrun, polling every 5 s, saw both at once and, with no "
        "error file to date them, names rank 1's SIGKILL as 'Root Cause (first observed "
        "failure)'. The real first failure is rank 3's exception.",
        crash("exception", [3], ["RuntimeError"]),
        note="torchrun dates a failure without an error file by the time it noticed it (whole "
        "seconds) and breaks ties by local rank, so its root cause here is rank 1. In an "
        "earlier recording rank 3 died of SIGABRT after its traceback ('terminate called "
        "without an active exception'), listed as exit code -6.",
        must=("checkpoint shard is corrupt", "(SIGKILL)"),
    ),
    Scenario(
        "raise_then_kill_record",
        torchrun(4, "raise_then_kill --raiser 3 --victim 1", launcher="--monitor-interval 5"),
        "As raise_then_kill with the worker's main under @record: rank 3's error file gives "
        "its RuntimeError a timestamp, so torchrun names it the root cause; rank 1 was "
        "SIGKILLed later.",
        crash("exception", [3], ["RuntimeError"]),
        env={"LOGFAIL_RECORD": "1"},
        must=("checkpoint shard is corrupt", "error.json", "(SIGKILL)"),
    ),
    # 2. the host OOM killer
    Scenario(
        "oom_kill_rank1",
        torchrun(4, "oom_kill --victim 1"),
        "Rank 1 grew its memory and was killed with SIGKILL from outside (as the kernel's OOM "
        "killer does; no traceback); the other ranks lose their Gloo peer.",
        crash("oom", [1], ["SIGKILL"], ["dmesg"]),
        must=("(SIGKILL)",),
    ),
    # 3. an exception on one rank
    Scenario(
        "ddp_valueerror_rank1",
        torchrun(4, "ddp_raise --victim 1"),
        "Rank 1 raised ValueError in the DDP model's forward at step 2 while ranks 0, 2, 3 "
        "waited in DDP's gradient all_reduce; some of them print Gloo 'Connection closed by "
        "peer' before torchrun SIGTERMs them.",
        crash("exception", [1], ["ValueError"]),
        must=("ValueError",),
    ),
    Scenario(
        "ddp_valueerror_rank1_tee",
        torchrun(4, "ddp_raise --victim 1", launcher="--tee 3"),
        "As ddp_valueerror_rank1 with `--tee 3` (`[defaultN]:` prefixes).",
        crash("exception", [1], ["ValueError"]),
        must=("[default1]:[rank1]: ValueError",),
    ),
    Scenario(
        "lightning_raise_rank1",
        f"python {HERE}lightning_job.py",
        "Lightning 2 processes (ddp, CPU, gloo; Lightning launches rank 1 itself): rank 1 "
        "raised ValueError in training_step at batch 3.",
        crash("exception", [1], ["ValueError"]),
        timeout=120,
        must=("ValueError",),
    ),
    # 4. start-up failures on every rank
    Scenario(
        "startup_argparse",
        torchrun(4, "--epochs 3", script=HERE + "startup_args.py"),
        "The launch command forgot the required --data-dir: all 4 ranks exit with argparse's "
        "usage error (exit code 2) before any collective.",
        crash("startup", None, ["--data-dir"]),
        must=("required: --data-dir",),
    ),
    Scenario(
        "startup_import",
        torchrun(2, "", script=HERE + "startup_import.py"),
        "Both ranks fail at import with ModuleNotFoundError before any collective.",
        crash("startup", None, ["ModuleNotFoundError"]),
        must=("ModuleNotFoundError",),
    ),
]
