"""Slurm's own words about a job step, and a launcher that never started.

- `slurmstepd: error: *** STEP 4242.0 ON n01 CANCELLED AT 2026-11-27T10:00:00 DUE TO TIME
  LIMIT ***` (and JOB, PREEMPTION, NODE FAILURE, JOB REQUEUE): the scheduler ended the job;
  a cancellation with no reason (scancel) or "DUE to SIGNAL" is a person's or a script's;
  "DUE TO TASK FAILURE" and "FAILED (non-zero exit code ...)" are srun tearing the step down
  after a task failed: consequences, never causes.
- `slurmstepd: error: execve(): torchrun: No such file or directory`, a shell's `torchrun:
  command not found`, `FileNotFoundError: ... 'torchrun'`: the launcher (or python) is not
  on the job's PATH. Only launchers and interpreters count: a missing helper tool in a job
  that went on is no failure.

(srun's per-task exits, `srun: error: n01: task 3: Exited with exit code 1`, are the
launcher family's: they say which rank or node failed.)

Formats: SchedMD/slurm src/slurmd/slurmstepd/req.c (the "*** %s ON %s CANCELLED AT %s ***"
lines), src/slurmd/slurmstepd/task.c ("execve(): %s: %m"), src/srun/launch.c (task exits);
the same in Slurm 22.05 and 26.11.
"""

from __future__ import annotations

from distdoctor.findings import Finding
from distdoctor.logs.lines import LogLine
from distdoctor.logs.problems import Problem, plural, ranks_text
from distdoctor.logs.signals import CAUSE, VICTIM, Family, Signal, rule

NAME = "slurm"

_LAUNCHERS = (r"(?:torchrun|python[\d.]*|deepspeed|accelerate|srun|mpirun|mpiexec|horovodrun|"
              r"ray|composer|lightning|tune|nemo|llamafactory-cli|axolotl|tilelang|uv|conda)")
RULES = (
    rule("cancelled", NAME, CAUSE,
         r"\*\*\* (?P<entity>STEP|JOB) (?P<id>\S+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+) "
         r"DUE TO (?P<why>TIME LIMIT|PREEMPTION|NODE FAILURE|JOB REQUEUE)"),
    rule("step_torn_down", NAME, VICTIM,
         r"\*\*\* (?P<entity>STEP|JOB) (?P<id>\S+) ON (?P<node>\S+) (?:CANCELLED AT (?P<at>\S+) "
         r"DUE TO TASK FAILURE|FAILED \(non-zero exit code)"),
    rule("launch_failed", NAME, CAUSE,
         r"srun: error: Task launch for (?P<step>\S+) failed on node (?P<node>[^:\s]+): "
         r"(?P<why>.+)"),
    rule("scancel", NAME, VICTIM,
         r"\*\*\* (?P<entity>STEP|JOB) (?P<id>\S+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+)"
         r"(?: DUE to SIGNAL (?P<signal>\w+)| BY \S+ )? ?\*\*\*"),
    rule("launcher_missing", NAME, CAUSE,
         rf"execve\(\): (?P<prog>[^:\s]+): (?P<err>No such file or directory|Permission denied)|"
         rf"^(?:\S*sh|bash|zsh|/bin/sh|srun|env)?:? ?(?:line \d+: |\d+: )?(?P<prog2>{_LAUNCHERS})"
         rf": (?:command )?not found|env: '?(?P<prog3>{_LAUNCHERS})'?: No such file or directory|"
         rf"No such file or directory: '(?P<prog4>{_LAUNCHERS})'|"
         # coreutils' wrappers (timeout, nohup, stdbuf: "failed to run command 'torchrun'";
         # quoted ‘’ in a UTF-8 locale) and nice's "nice: 'torchrun': No such file..."
         rf"(?:failed to run command |^nice: )[‘'\"]?(?P<prog5>{_LAUNCHERS})[’'\"]?: "
         rf"No such file or directory"),
)


class SlurmFamily(Family):
    name = NAME
    orchestrator = True
    anchors = (b"CANCELLED AT", b"FAILED (non-zero", b"execve()", b"ommand not found",
               b"Task launch for",
               b": not found", b"No such file or directory")
    rules = RULES

    def feed(self, line: LogLine) -> list[Signal]:
        out = super().feed(line)
        for s in out:
            f = s.fields
            prog = (f.pop("prog2", None) or f.pop("prog3", None) or f.pop("prog4", None)
                    or f.pop("prog5", None))
            if prog:
                f["prog"] = prog
        return out


# --- what its problems mean ---------------------------------------------------------------
_WHY = {"TIME LIMIT": "its time limit was reached", "PREEMPTION": "it was preempted",
        "NODE FAILURE": "a node failed (slurmctld's log says which and why)",
        "JOB REQUEUE": "it was requeued"}
_REMEDY = {
    "TIME LIMIT": "Raise the job's --time (or checkpoint more often and resume); `sacct -j "
                  "JOBID -o JobID,Elapsed,Timelimit,State` shows how long it ran.",
    "PREEMPTION": "A higher-priority job took the nodes: resume from the last checkpoint, or "
                  "submit to a partition/QOS that is not preemptible.",
    "NODE FAILURE": "Read `scontrol show node NODE` and slurmctld's log for why the node went "
                    "down; exclude it (--exclude) and resume.",
    "JOB REQUEUE": "The job was requeued (a node failure or `scontrol requeue`): it starts "
                   "again from its beginning or its checkpoint.",
}
_MISSING_REMEDY = ("The job's environment does not have it: activate the virtual environment "
                   "or module in the batch script before srun (srun passes the submitting "
                   "shell's PATH unless --export says otherwise), or give its full path "
                   "(`python -m torch.distributed.run` needs only python).")
_SCANCEL_REMEDY = ("Slurm stopped the step on request (scancel, or a signal from the batch "
                   "script): nothing in this log failed before it. `sacct -j JOBID -o "
                   "JobID,State,ExitCode` shows who and when.")


def describe(p: Problem, ctx) -> Finding:
    f = p.first.fields
    if p.rule == "launcher_missing":
        prog = f.get("prog", "the launcher")
        err = f.get("err", "not found")
        hosts, tasks = sorted(p.hosts), sorted(p.ranks)  # srun's labels: its tasks
        on = (f" on {', '.join(hosts)}" if hosts else "") + (
            f" (srun task{plural(tasks)} {ranks_text(tasks)})" if tasks else "")
        fnd = ctx.finding(p, "crash", "error", f"the launcher could not start{on}: {prog}: "
                          f"{err.lower() if err != 'not found' else 'command not found'} (not "
                          f"installed or not on the job's PATH); no rank ever ran", [],
                          _MISSING_REMEDY)
        fnd.details["family"] = "launcher"
        return fnd
    if p.rule == "launch_failed":
        fnd = ctx.finding(p, "crash", "error", f"srun could not launch step {f.get('step')} on "
                          f"{f.get('node')}: {f.get('why', '').strip()}; no rank ran there", [],
                          "Slurm failed to start the tasks on that node (slurmd's log on it says "
                          "why; 'Job credential expired' is a clock skew between the nodes and "
                          "slurmctld, or a slurmd restarted mid-job): fix or exclude the node.")
        fnd.details["family"] = "launcher"
        return fnd
    why = f.get("why", "")
    entity = "job step" if f.get("entity") == "STEP" else "job"
    return ctx.finding(p, "crash", "error", f"Slurm cancelled {entity} {f.get('id')} on "
                       f"{f.get('node')} at {f.get('at')}: {_WHY.get(why, why.lower())}", [],
                       _REMEDY.get(why))


VICTIMS = {"scancel": "Slurm cancelled the step",
           "step_torn_down": "srun tore the step down after a task failed"}


def victim_culprit(p: Problem, ctx) -> Finding | None:
    """A cancellation nothing in the log explains: said as what it is."""
    f = p.first.fields
    if p.rule == "step_torn_down":
        return ctx.finding(p, "crash", "error", f"Slurm tore down step {f.get('id')} on "
                           f"{f.get('node')} because a task failed; that task's own error is not "
                           f"in this log (srun lists the tasks it terminated: the one missing "
                           f"from that list failed)", [],
                           "Read the failed task's output (srun --output=%t.out keeps one file "
                           "per task) for its first error.")
    if p.rule != "scancel":
        return None
    entity = "job step" if f.get("entity") == "STEP" else "job"
    by = f" (signal {f['signal']})" if f.get("signal") else " (scancel, or the scheduler)"
    return ctx.finding(p, "crash", "error", f"Slurm cancelled {entity} {f.get('id')} on "
                       f"{f.get('node')} at {f.get('at')}{by}; nothing in this log failed "
                       f"before it", [], _SCANCEL_REMEDY)
