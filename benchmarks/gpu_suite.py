"""The GPU suite (issue 27): every GPU-only path, then the overhead goals, on a machine with
a core per thread, in commands of under 10 minutes each.

On a lent GPU machine (a bare copy of the working tree; what goes under $OUT comes back):

    python3 benchmarks/gpu_suite.py --stage tests   --out $OUT  # tests/gpu + NVML recordings
    python3 benchmarks/gpu_suite.py --stage steps-a --out $OUT  # step_overhead.py, 5 modes
    python3 benchmarks/gpu_suite.py --stage steps-b --out $OUT  # step_overhead.py, 4 modes
    python3 benchmarks/gpu_suite.py --stage paired  --out $OUT  # tracer_overhead.py paired
    python3 benchmarks/gpu_suite.py --stage torch215 --out $OUT # torch 2.15's nccl2, 2 GPUs

The torch215 stage needs torch >= 2.15 in the interpreter that runs the suite (run it with
that interpreter); elsewhere it is reported skipped with the reason.

Here, without a GPU (the dry run: CUDA parts skipped and reported so, tiny sizes):

    python benchmarks/gpu_suite.py --cpu-only --stage all --out /tmp/gpu-dry

Each call installs the project from the working tree if it is not yet importable from it
(pip, offline, editable; wheels in ./.whl first, if carried there), uses the torch that
the interpreter running it has (it cannot fetch one: it says when that torch has no
CUDA), and writes summary.json, summary.md and suite.log under --out, plus the GPU
tier's NVML recordings (nvml_*.json): at most 8 files, as the device tool brings back.
The CPU benchmarks run with CUDA hidden. `--merge DIR...` joins the summaries of
separate calls into one. Exit: 0 all ran and passed, 1 a stage failed, 2 bad usage or no
install, 3 the GPU parts were skipped on a run that did not say --cpu-only. The machine
and the install: gpu_suite_machine.py; the summary: gpu_suite_report.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import gpu_suite_report as report  # noqa: E402
from gpu_suite_machine import cuda_reason, ensure_installed  # noqa: E402


def _load(name: str):
    """A benchmark of this folder as a module (they import no torch at the top)."""
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STEP_MODES = list(_load("step_overhead").MODES)  # in two halves of under 10 minutes each
STAGES = {"tests": "the GPU tier (pytest tests/gpu -m gpu) and its NVML recordings",
          "steps-a": f"step_overhead.py: {', '.join(STEP_MODES[:5])}",
          "steps-b": f"step_overhead.py: {', '.join(STEP_MODES[5:])}",
          "paired": "tracer_overhead.py paired: 2 gloo ranks, 1-element all_reduce",
          "torch215": "torch >= 2.15, default nccl (nccl2), 2 GPUs traced: torch's Flight "
                      "Recorder as bare, its NaN check, hook counts (issue 51)"}
# GPU tests a stage of their own runs, which the `tests` stage leaves out (its budget)
STAGE_TESTS = {"torch215": "tests/gpu/test_torch215_nccl.py"}
SIZES = {  # full: the benchmarks' own defaults; tiny: the dry run's smallest that still runs
    "full": {"cycles": 24, "block": 0, "rounds": 3, "launched_steps": 40, "modes": 9,
             "paired_rounds": 150, "paired_launches": 15},
    "tiny": {"cycles": 2, "block": 2, "rounds": 1, "launched_steps": 12, "modes": 1,
             "paired_rounds": 20, "paired_launches": 2},
}
MARGIN_S = 20  # left for the summary after the last child is stopped


class Suite:
    """One invocation: its out folder, log, deadline and environment for children."""

    def __init__(self, out: Path, budget_s: float, cpu_only: bool, size: str,
                 modes: list[str]):
        self.out, self.cpu_only, self.size, self.modes = out, cpu_only, SIZES[size], modes
        self.deadline = time.monotonic() + budget_s
        self.work = Path(tempfile.mkdtemp(prefix="dd-gpu-suite-"))
        self.log = open(out / "suite.log", "a", buffering=1)
        self.running: subprocess.Popen | None = None
        self.env = dict(os.environ, PYTHONUNBUFFERED="1",
                        PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                              os.environ.get("PATH", "")]))

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")

    def left_s(self) -> float:
        return self.deadline - time.monotonic() - MARGIN_S

    def child(self, argv: list[str], env: dict | None = None, cwd: Path = ROOT,
              timeout_s: float | None = None) -> tuple[int | None, str]:
        """Run a child in its own session; all its output to the log. (exit, output);
        exit None when it was stopped at the deadline: SIGTERM to its session (so that
        `distdoctor run` stops its ranks itself), SIGKILL 10 s later."""
        limit = min(self.left_s(), timeout_s or 1e9)
        self.log.write(f"$ {' '.join(argv)}\n")
        proc = subprocess.Popen(argv, cwd=cwd, env={**self.env, **(env or {})},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.running = proc
        try:
            out, _ = proc.communicate(timeout=max(1.0, limit))
            code = proc.returncode
        except subprocess.TimeoutExpired:
            stop_session(proc)
            out, _ = proc.communicate()
            code = None
        finally:
            self.running = None
        self.log.write(out + (f"[stopped after {limit:.0f} s]\n" if code is None else ""))
        return code, out


def stop_session(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(wait_s)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue


# --- stages ---------------------------------------------------------------------------
def stage_tests(suite: Suite, facts: dict, targets: list[str] | None = None,
                name: str = "tests") -> dict:
    """pytest -m gpu on `targets` (default: tests/gpu less the files other stages run)."""
    if targets is None:
        targets = ["tests/gpu", *(f"--ignore={f}" for f in STAGE_TESTS.values())]
    if lacking := [m for m in ("pytest", "pytest_timeout") if m in facts.get("missing", [])]:
        return {"status": "failed", "reason": f"{', '.join(lacking)} not installed for "
                f"{facts.get('executable')}: carry the wheels in .whl (README)"}
    results, junit = suite.work / f"measurements-{name}.jsonl", suite.work / f"junit-{name}.xml"
    env = {"DISTDOCTOR_GPU_RESULTS": str(results), "DISTDOCTOR_GPU_FIXTURES": str(suite.out)}
    if suite.cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    code, out = suite.child([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "-o", "addopts=", "-rs", "-m", "gpu", "--junitxml", str(junit),
                             "--basetemp", str(suite.work / "pytest"), *targets], env=env)
    tests = report.junit_cases(ET.parse(junit).getroot()) if junit.exists() else []
    measured = [json.loads(line) for line in results.read_text().splitlines()] \
        if results.exists() else []
    outcomes = [t["outcome"] for t in tests]
    skipped = sorted({t["message"] for t in tests if t["outcome"] == "skipped"})
    if code is None:
        status, reason = "timeout", "stopped at the command's time budget"
    elif any(o in ("failed", "error") for o in outcomes) or code not in (0, 5) or not tests:
        status = "failed"
        reason = f"pytest exit {code}" + ("" if tests else ": no GPU test was collected")
    elif all(o == "skipped" for o in outcomes):
        status, reason = "skipped", "; ".join(skipped)
    else:
        status = "passed"
        reason = f"{outcomes.count('skipped')} skipped: {'; '.join(skipped)}" if skipped else ""
    fixtures = sorted(p.name for p in suite.out.glob("nvml_*.json"))
    return {"status": status, "reason": reason, "tests": tests, "measurements": measured,
            "nvml_fixtures": fixtures, "pytest_tail": out[-1500:]}


def _cpu_env() -> dict:
    return {"CUDA_VISIBLE_DEVICES": ""}  # the CPU benchmarks: gloo ranks, a core per thread


def stage_steps(suite: Suite, facts: dict, modes: list[str]) -> dict:
    s = suite.size
    rows = []
    for mode in modes:
        if suite.left_s() < 30:
            rows.append({"mode": mode, "status": "not run",
                         "reason": "the command's time budget is spent: run this mode "
                                   f"again with --modes '{mode}'"})
            continue
        started = time.monotonic()
        code, out = suite.child([sys.executable, __file__, "--child-steps", mode,
                                 str(s["cycles"]), str(s["block"]), str(s["rounds"]),
                                 str(s["launched_steps"])], env=_cpu_env())
        found = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
        if found and code == 0:
            rows.append({"mode": mode, "status": "ran", **found[-1]})
        elif code is None:
            rows.append({"mode": mode, "status": "stopped", "reason": "stopped at the "
                         f"command's time budget: run it again with --modes '{mode}'"})
        else:
            last = out.strip().splitlines()[-1] if out.strip() else ""
            rows.append({"mode": mode, "status": "failed", "reason": f"exit {code}: {last}"[:300]})
        rows[-1]["wall_s"] = round(time.monotonic() - started, 1)
        suite.say(f"  {mode}: {rows[-1]['status']} ({rows[-1]['wall_s']:.0f} s)")
    left = [r["mode"] for r in rows if r["status"] != "ran"]
    status = "passed" if not left else (
        "failed" if any(r["status"] == "failed" for r in rows) else "timeout")
    return {"status": status, "reason": f"not run or failed: {', '.join(left)}" if left else "",
            "modes": rows}


def stage_paired(suite: Suite, facts: dict) -> dict:
    s = suite.size
    code, out = suite.child([sys.executable, __file__, "--child-paired",
                             str(s["paired_rounds"]), str(s["paired_launches"])], env=_cpu_env())
    launches = [tuple(map(float, line.split()[1:3])) for line in out.splitlines()
                if line.startswith("LAUNCH ")]
    if not launches:
        return {"status": "failed" if code is not None else "timeout",
                "reason": f"no paired launch finished: {out.strip()[-300:]}"}
    ratios = [traced / plain for plain, traced in launches]
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return {"status": "passed" if code == 0 else "timeout",
            "reason": "" if code == 0 else f"{len(launches)} launches before the budget",
            "launches": [{"plain_us": p, "traced_us": t} for p, t in launches],
            "ratio_median": statistics.median(ratios), "ratio_q1": q[0], "ratio_q3": q[2],
            "rounds": s["paired_rounds"]}


def run_stages(suite: Suite, names: list[str], facts: dict, cuda_skip: str) -> list[dict]:
    done = []
    for name in names:
        started = time.monotonic()
        suite.say(f"== stage {name}: {STAGES[name]}")
        if suite.left_s() < 30:
            result = {"status": "not run", "reason": "the command's time budget is spent"}
        elif name == "tests":
            result = stage_tests(suite, facts)
        elif name == "paired":
            result = stage_paired(suite, facts)
        elif name in STAGE_TESTS:
            result = stage_tests(suite, facts, [STAGE_TESTS[name]], name)
        else:
            own = STEP_MODES[:5] if name == "steps-a" else STEP_MODES[5:]
            chosen = [m for m in own if m in suite.modes] if suite.modes else own
            result = stage_steps(suite, facts, chosen[:suite.size["modes"]])
        result.update(name=name, wall_s=round(time.monotonic() - started, 1),
                      cuda_skipped=cuda_skip if name == "tests" or name in STAGE_TESTS else "")
        suite.say(f"== stage {name}: {result['status']} in {result['wall_s']:.0f} s"
                  f"{' (' + result['reason'] + ')' if result.get('reason') else ''}")
        done.append(result)
    return done


# --- children: the benchmarks' own entry points, in a process the deadline can stop ----
def child_steps(mode: str, cycles: int, block: int, rounds: int, launched_steps: int) -> int:
    so = _load("step_overhead")
    args = argparse.Namespace(block=block or None, cycles=cycles, rounds=rounds,
                              launched_steps=launched_steps)
    steps = so.in_job(mode, args)
    bare_ms, launched = so.launched(mode, args) if rounds else (0.0, [])
    result = {"ranks": so.MODES[mode][0], "cycles": len(steps),
              "off_ms": statistics.median(ms for c in steps.values() for ms in c["off"]),
              "traced_off": so.ratio(steps, "traced", "off"),
              "recorder_off": so.ratio(steps, "recorder", "off"),
              "traced_recorder": so.ratio(steps, "traced", "recorder"),
              "launched": [statistics.median(launched), min(launched), max(launched)]
              if launched else None, "bare_ms": bare_ms}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def child_paired(rounds: int, launches: int) -> int:
    to = _load("tracer_overhead")
    for _ in range(launches):
        plain, traced = to.paired(rounds)
        print(f"LAUNCH {plain} {traced}", flush=True)
    return 0


# --- the command ------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="benchmarks/gpu_suite.py",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", default="all",
                    help=f"comma-separated, of: {', '.join(STAGES)}, or all (default)")
    ap.add_argument("--out", type=Path, help="folder for summary.json, summary.md, suite.log")
    ap.add_argument("--cpu-only", action="store_true",
                    help="dry run: CUDA hidden (its tests reported skipped), tiny sizes")
    ap.add_argument("--size", choices=sorted(SIZES), help="full (default) or tiny "
                    "(default with --cpu-only)")
    ap.add_argument("--modes", help="only these step_overhead modes of the steps stages, "
                    "comma-separated (to finish what a stage left for want of time)")
    ap.add_argument("--budget-s", type=float, default=560,
                    help="stop starting work after this many seconds (default 560: one "
                    "command of the device tool may run 600)")
    ap.add_argument("--plan", action="store_true", help="print the plan as JSON; run nothing")
    ap.add_argument("--merge", nargs="+", type=Path, metavar="DIR",
                    help="join these folders' summary.json into --out")
    args = ap.parse_args(argv)
    stages = list(STAGES) if args.stage == "all" else args.stage.split(",")
    if bad := [s for s in stages if s not in STAGES]:
        ap.error(f"unknown stage {bad[0]!r}; choose from {', '.join(STAGES)} or all")
    if args.modes and (bad := [m for m in args.modes.split(",") if m not in STEP_MODES]):
        ap.error(f"unknown mode {bad[0]!r}; choose from {', '.join(STEP_MODES)}")
    if not args.plan and not args.out:
        ap.error("--out DIR is required (the device tool brings back what is under $OUT)")
    args.stages, args.size = stages, args.size or ("tiny" if args.cpu_only else "full")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child-steps"]:
        return child_steps(argv[1], *map(int, argv[2:6]))
    if argv[:1] == ["--child-paired"]:
        return child_paired(int(argv[1]), int(argv[2]))
    args = parse_args(argv)
    if args.plan:
        print(json.dumps({"stages": {s: STAGES[s] for s in args.stages}, "size": args.size,
                          **SIZES[args.size], "budget_s": args.budget_s,
                          "cpu_only": args.cpu_only}, indent=1))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        summary = report.merge([json.loads((d / "summary.json").read_text())
                                for d in args.merge])
        return report.write(args.out, summary)
    suite = Suite(args.out, args.budget_s, args.cpu_only, args.size,
                  args.modes.split(",") if args.modes else [])

    def stopped(signum, frame):  # children run in sessions of their own: stop them too
        if suite.running is not None:
            stop_session(suite.running)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    started = time.time()
    try:  # (its work folder goes at the end: what is kept is under --out)
        try:
            facts, install = ensure_installed(suite)
        except RuntimeError as exc:
            suite.say(f"gpu_suite: {exc}")
            return 2
        cuda_skip = cuda_reason(facts, args.cpu_only)
        suite.say(f"gpu_suite: {facts.get('cpus')} CPU cores, torch {facts.get('torch')}, "
                  f"GPUs {facts.get('gpus') or 'none'}; {install}"
                  f"{'; CUDA parts skipped: ' + cuda_skip if cuda_skip else ''}")
        stages = run_stages(suite, args.stages, facts, cuda_skip)
        summary = report.build(facts, install, stages, args.cpu_only, args.size, started,
                               suite.work)
        return report.write(args.out, summary)
    finally:
        shutil.rmtree(suite.work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
