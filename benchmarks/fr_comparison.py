"""distdoctor against PyTorch's own Flight Recorder analyzer, on the same bugs (issue 25).

Every case of the bug corpus (tests/jobs/bugs/, culprits and lines as
tests/test_diagnosis_corpus.py expects them) and a straggler (tests/jobs/stragglers/) runs
twice on gloo:

1. Without distdoctor, with the Flight Recorder on (TORCH_FR_BUFFER_SIZE) and a shim in
   each rank that dumps it the way NCCL does: at a hang, from a watchdog thread once an op
   has been in flight for --fr-timeout seconds (the first rank to time out tells the
   others, which dump too), and at exit otherwise. gloo's recorder leaves pg_config empty,
   which stops torchfrtrace with a KeyError (column "raw"); the shim also writes each dump
   with the groups' ranks filled in as NCCL's recorder fills them, and that set is what
   torchfrtrace (`python -m torch.distributed.flight_recorder.fr_trace DIR`, no flags)
   and `distdoctor diagnose --fr-dump` are run on.
2. Under `distdoctor run --on-hang kill` (hangs decided by progress, no timeout set); the
   answer is the first finding on disk; the run is then exported with
   `distdoctor export --flight-recorder` and torchfrtrace is run on that too.

Times are from the launch of the ranks to the answer (the analyzer's run included), so
the Flight Recorder's hang column grows with its timeout: --fr-timeout here, NCCL's
default 10 minutes in the field. One run per case; on a shared machine, timings are noisy.

  python benchmarks/fr_comparison.py [--fr-timeout 10] [--cases shape_mismatch,...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from test_diagnosis_corpus import BUGS, CASES, _markers  # noqa: E402  (one list of bugs)

from distdoctor.export.fr_analyzer import TorchVerdict, run_torchfrtrace  # noqa: E402
from distdoctor.launch.env import free_port, rank_env  # noqa: E402

STRAGGLER = ROOT / "tests" / "jobs" / "stragglers" / "logs_before_allreduce.py"
# case -> (job, ranks, culprits, the lines that name the culprit, what the bug is)
WHAT = {"rank0_only_broadcast": "op mismatch", "shape_mismatch": "shape mismatch",
        "dtype_mismatch": "dtype mismatch", "wrong_group": "group mismatch",
        "uneven_batches": "uneven batches", "stuck_outside": "hang in compute",
        "oom_killed": "dead rank", "p2p_deadlock": "p2p deadlock",
        "group_order_deadlock": "group order deadlock",
        "swallowed_exception": "skipped step"}

SHIM = textwrap.dedent('''
    """Runs JOB with a Flight Recorder dump the way NCCL takes one: from a watchdog once
    an op has been in flight for FRCMP_TIMEOUT s (and then on every rank), or at exit."""
    import atexit, json, os, pickle, runpy, sys, threading, time
    import torch, torch.distributed as dist

    OUT, TIMEOUT = os.environ["FRCMP_OUT"], float(os.environ["FRCMP_TIMEOUT"])
    RANK = int(os.environ["RANK"])
    c10d = torch._C._distributed_c10d
    lock, taken, seen = threading.Lock(), [], {}


    def put(path, data):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "wb") as fh:
            fh.write(data)
        os.replace(path + ".tmp", path)


    def groups():
        """What NCCL's recorder puts in pg_config and gloo's leaves out; kept as the
        groups come (a job that destroys its groups before exiting has none at exit)."""
        try:
            for pg in list(dist.distributed_c10d._world.pg_map):
                ranks = dist.get_process_group_ranks(pg)
                seen[pg.group_name] = {"name": pg.group_name, "desc": pg.group_desc,
                                       "ranks": str(sorted(ranks))}
        except Exception:
            pass
        return dict(seen)


    def dump(why):
        with lock:
            if taken:
                return
            taken.append(why)
        data = c10d._dump_fr_trace()
        put(f"{OUT}/raw/nccl_trace_rank_{RANK}", data)
        d = pickle.loads(data)
        d["pg_config"] = groups() or d["pg_config"]
        put(f"{OUT}/filled/nccl_trace_rank_{RANK}", pickle.dumps(d))
        put(f"{OUT}/why/{RANK}", why.encode())


    def watchdog():
        while not taken:
            time.sleep(0.25)
            groups()
            if os.path.exists(f"{OUT}/dump-now"):
                return dump("a peer timed out")
            try:
                fr = json.loads(c10d._dump_fr_trace_json())
            except Exception:
                continue
            now = time.time_ns()
            if any(not e["retired"] and now - e["time_created_ns"] > TIMEOUT * 1e9
                   for e in fr.get("entries", [])):
                put(f"{OUT}/dump-now", b"")
                return dump("timeout")


    def destroy(*args, _destroy=dist.destroy_process_group, **kwargs):
        groups()  # the last moment the groups can be seen
        return _destroy(*args, **kwargs)


    dist.destroy_process_group = destroy
    atexit.register(dump, "exit")
    threading.Thread(target=watchdog, daemon=True).start()
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
''')


def _kill(procs) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()


def fr_side(job: Path, nproc: int, tmp: Path, timeout_s: float) -> dict:
    """Run the job bare with the recorder on; time until every live rank has dumped."""
    out, shim = tmp / "fr", tmp / "shim.py"
    shim.write_text(SHIM)
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="2000", FRCMP_OUT=str(out),
               FRCMP_TIMEOUT=str(timeout_s), PYTHONUNBUFFERED="1")
    port, t0 = free_port(), time.monotonic()
    procs = [subprocess.Popen([sys.executable, str(shim), str(job)],
                              env=rank_env(env, r, nproc, port), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                              start_new_session=True) for r in range(nproc)]
    try:
        # past the corpus's own gloo timeout (120 s): a hang the recorder cannot see
        # (gloo's keeps no p2p op) ends there, with an exception and a dump at exit
        deadline = t0 + max(timeout_s + 90, 150)
        while time.monotonic() < deadline:
            live = {r for r, p in enumerate(procs) if p.poll() is None}
            why = out / "why"
            dumped = {int(p.name) for p in why.iterdir() if p.name.isdigit()} \
                if why.exists() else set()
            if not live or ((out / "dump-now").exists() and live <= dumped):
                break
            time.sleep(0.05)
        dumped_at = time.monotonic() - t0
    finally:
        _kill(procs)
    filled, raw = out / "filled", out / "raw"
    if not filled.exists():
        return {"verdict": TorchVerdict("failed", error="no dump written"), "raw": None,
                "time": dumped_at, "ours_on_dump": "-"}
    verdict = run_torchfrtrace(filled)
    return {"verdict": verdict, "raw": run_torchfrtrace(raw), "time": dumped_at + verdict.seconds,
            "ours_on_dump": _dd_summary(_diagnose(["--fr-dump", str(filled)]), None)}


def _diagnose(args: list[str]) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "distdoctor", "diagnose", *args, "--json"],
                          capture_output=True, text=True, timeout=120)
    try:
        return json.loads(proc.stdout)["findings"]
    except (ValueError, KeyError):
        return []


def _main_finding(findings: list[dict], kind: str | None) -> dict | None:
    for f in findings:
        if (kind is None and f["severity"] == "error") or (kind and f["kind"] == kind):
            return f
    return None


def _dd_summary(findings: list[dict], kind: str | None) -> str:
    f = _main_finding(findings, kind)
    if f is None:
        return "no finding"
    where = f" at #{f['seq']} in group {f['group']}" if f.get("seq") is not None else ""
    return f"{f['kind']}, rank(s) {','.join(map(str, f['ranks']))}{where}"


def dd_side(job: Path, nproc: int, tmp: Path, kind: str | None) -> dict:
    """Run the job under distdoctor; time until the finding is on disk."""
    run_dir = tmp / "run"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "distdoctor", "run", "--nproc", str(nproc),
                             "--run-dir", str(run_dir), "--on-hang", "kill", "--grace", "2",
                             "--", str(job)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    found_at = None
    try:
        while proc.poll() is None and time.monotonic() - t0 < 300:
            try:
                live = json.loads((run_dir / "findings.json").read_text())["findings"]
            except (OSError, ValueError, KeyError):
                live = []
            if found_at is None and _main_finding(live, kind):
                found_at = time.monotonic() - t0
            time.sleep(0.05)
        ended = time.monotonic() - t0
    finally:
        _kill([proc])
    findings = _diagnose([str(run_dir)])
    if found_at is None:  # found post-mortem only: the job's end plus the diagnosis
        found_at = time.monotonic() - t0 if _main_finding(findings, kind) else ended
    export = tmp / "export"
    subprocess.run([sys.executable, "-m", "distdoctor", "export", str(run_dir),
                    "--flight-recorder", str(export)], capture_output=True, timeout=120)
    return {"findings": findings, "main": _main_finding(findings, kind), "time": found_at,
            "summary": _dd_summary(findings, kind), "export": run_torchfrtrace(export)}


def _culprit(named, culprits: list[int]) -> str:
    named = set(named)
    if named == set(culprits):
        return "yes"
    if named & set(culprits):
        return "partly (" + ",".join(map(str, sorted(named))) + ")"
    return "no" + (f" ({','.join(map(str, sorted(named)))})" if named else "")


def _torch_line(v: TorchVerdict, job: Path, lines: set[int]) -> str:
    mine = [ln for _, file, ln in v.frames if file.endswith(job.name)]
    if not mine:
        return "no"
    return "yes" if set(mine) & lines else f"no (line {mine[-1]}, another rank's)"


def _dd_line(f: dict | None, culprits: list[int], lines: set[int], kind: str | None) -> str:
    if f is None:
        return "no"
    if kind == "straggler":
        top = (f.get("details") or {}).get("top_frames") or [{}]
        return "yes" if top[0].get("line") in lines else "no"
    got = {c.get("line") for c in f.get("callsites", []) if c.get("rank") in culprits}
    return "yes" if got & lines else "no"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fr-timeout", type=float, default=10.0,
                    help="the shim's watchdog timeout: an op in flight this long dumps (s)")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    args = ap.parse_args()
    # the culprit's line: the corpus's marker, or for a rank stuck outside any collective,
    # the line it is stuck at (its last collective is not where the bug is)
    cases = {name: (BUGS / f"{name}.py", n, culprits,
                    _markers(name).get("stuck") or _markers(name)[marker], None)
             for name, (n, _kind, culprits, marker) in sorted(CASES.items())}
    slow = {no for no, text in enumerate(STRAGGLER.read_text().splitlines(), start=1)
            if "# expect: slow_line" in text}
    cases["straggler"] = (STRAGGLER, 4, [2], slow, "straggler")
    WHAT["straggler"] = "straggler"
    wanted = [c for c in args.cases.split(",") if c] or list(cases)
    rows = []
    for name in wanted:
        job, nproc, culprits, lines, kind = cases[name]
        tmp = Path(tempfile.mkdtemp(prefix=f"frcmp-{name}-"))
        try:
            fr = fr_side(job, nproc, tmp, args.fr_timeout)
            dd = dd_side(job, nproc, tmp, kind)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        v = fr["verdict"]
        raw = fr["raw"].summary() if fr["raw"] else "-"
        rows.append(
            f"| {name} ({WHAT[name]}, {nproc} ranks) | {v.summary()} | "
            f"{_culprit(v.ranks, culprits)} | {_torch_line(v, job, lines)} | "
            f"{fr['time']:.1f} s | {dd['summary']} | "
            f"{_culprit(dd['main']['ranks'] if dd['main'] else (), culprits)} | "
            f"{_dd_line(dd['main'], culprits, lines, kind)} | {dd['time']:.1f} s | "
            f"{dd['export'].summary()} | {fr['ours_on_dump']} | {raw} |")
        print(f"{name}: done", file=sys.stderr, flush=True)
    print(f"torchfrtrace: torch's analyzer on the recorder's dumps (watchdog timeout "
          f"{args.fr_timeout:g} s); distdoctor: `distdoctor run`, first finding on disk.\n")
    print("| case | torchfrtrace's verdict | culprit named | line named | time to answer "
          "| distdoctor's verdict | culprit named | line named | time to answer "
          "| torchfrtrace on distdoctor's export | distdoctor --fr-dump on the recorder's "
          "dumps | torchfrtrace on the raw gloo dumps |")
    print("|" + "---|" * 12)
    print("\n".join(rows))
    print("\n(distdoctor numbers a group's collectives from 0 in a run, the Flight Recorder "
          "from 1: #3 in one is #4 in the other.)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
