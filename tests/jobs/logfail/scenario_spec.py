"""What a recorded scenario is (scenarios.py holds the table record.py runs): its record,
a torchrun command line on one node, and the ground truth each gives (expected.json).

`expect` holds the manifest fields of tests/fixtures/logs/real/expected.json:
kind (crash|comm_error|mismatch|hang: the top finding's kind), family (launcher, oom, store,
nccl, gloo, mismatch, ddp, exception, serial_work, startup, healthy), ranks (the culprit
ranks the top finding must name; [] when the log cannot tell; None: not checked), words
(what the top finding's summary must contain, case-insensitive), remedy_words (optional),
quiet (True: no error or warning finding at all).
"""

from dataclasses import dataclass, field

TORCHRUN = "python -m torch.distributed.run"
WORKER = "tests/jobs/logfail/worker.py"
HERE = "tests/jobs/logfail/"


def torchrun(nproc: int, args: str, launcher: str = "", script: str = WORKER) -> str:
    """A torchrun command line on one node; {port} is filled in by record.py."""
    parts = [TORCHRUN, f"--nproc-per-node {nproc} --master-port {{port}}", launcher, script, args]
    return " ".join(p for p in parts if p)


@dataclass
class Scenario:
    name: str
    cmd: str  # split like a shell line; "python" is this interpreter
    what: str
    expect: dict
    env: dict = field(default_factory=dict)
    timeout: float = 60
    hold_port: bool = False
    note: str = ""
    must: tuple[str, ...] = ()  # the run shows what the scenario is about only with these
    must_not: tuple[str, ...] = ()
    tries: int = 3  # some outcomes are races: rerun until must/must_not hold

    def env_shown(self) -> list[str]:
        return [f"{k}={v.replace('{port}', 'PORT')}" for k, v in self.env.items()]


# a healthy run's log shows none of these (a run that does is rerun)
HEALTHY_NOT = ("terminate called", "FAILED", "Traceback")


def crash(family, ranks, words, remedy=None, kind="crash"):
    out = {"kind": kind, "family": family, "ranks": ranks, "words": words, "quiet": False}
    if remedy:
        out["remedy_words"] = remedy
    return out

