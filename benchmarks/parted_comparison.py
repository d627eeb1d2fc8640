"""Where the ranks parted ways (issue 33): distdoctor against torch's own tools on the
parted-ways corpus (tests/jobs/parted/, manifest in tests/jobs/parted/CASES.md).

Every case (a job at a number of ranks) runs three times on gloo:

1. Under `python -m distdoctor run --nproc N --grace 2 --on-hang kill -- JOB` (hangs
   decided by progress, no timeout set): the first error finding, as the run wrote it
   (RUN_DIR/findings.json), with its ranks and call sites, and `details.parted_at` where
   the finding has one. The run is then exported with `distdoctor export
   --flight-recorder` and torchfrtrace is run on that too (benchmarks/fr_comparison.py's
   dd_side).
2. Bare under torchrun with TORCH_DISTRIBUTED_DEBUG=DETAIL, 60 s at most: the first line
   of the ranks' output that reports an error.
3. Bare with the Flight Recorder on and a shim that dumps it the way NCCL does, then
   torchfrtrace on the dumps (benchmarks/fr_comparison.py's fr_side and shim).

The jobs' gloo timeout is 120 s so that distdoctor, not gloo, notices first. In the bare
runs (2, 3) it is PARTED_GLOO_TIMEOUT (--gloo-timeout, 30 s), so that a hang torch's tools
cannot see ends in gloo's own error within the time limit; a hang is then reported as
what gloo says at its timeout.

Scoring (columns "culprit" and "line"): the expected culprit rank(s) and the lines marked
`# expect: parted` / `caller` (/ `went_on` for p2p, where the issue asks for the line the
culprit went on to) in the job; a tie must be said as a tie with both `tie_a` and `tie_b`
lines; a two-thread race must name the threads and the background thread's line; a
healthy job must have no error or warning finding.

  python benchmarks/parted_comparison.py [--cases stray_barrier_helper,wrong_peer@4]
      [--out FILE.json] [--fr-timeout 10] [--gloo-timeout 30]
  python benchmarks/parted_comparison.py --rescore FILE.json   # score saved runs again

To score another checkout of distdoctor (e.g. the last commit, before a change), put it
first on PYTHONPATH: the ranks inherit it. The distdoctor used is printed at the top.
"""


from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]
from fr_comparison import _kill, dd_side, fr_side  # noqa: E402  (one shim, one runner)
from parted_comparison_cases import CASES, PARTED, Case  # noqa: E402
from parted_comparison_report import _row, render, score  # noqa: E402

import distdoctor  # noqa: E402

# --- torch's TORCH_DISTRIBUTED_DEBUG=DETAIL --------------------------------------------

_ERR = re.compile(r"(Error|Exception|mismatch|[Tt]imed out|[Tt]imeout|Aborted|abort)")
_NOISE = re.compile(r"^\s*(File \"|Traceback|\^|~|During handling|The above exception|"
                    r"\[rank\d+\]:\s*(File \"|Traceback|\^|~))")


def detail_side(job: Path, nproc: int, gloo_timeout: float, limit: float = 60.0,
                debug: str | None = "DETAIL") -> dict:
    """The bare job under torchrun with TORCH_DISTRIBUTED_DEBUG=DETAIL (`debug`; None:
    without it): the first error line the ranks printed (torchrun's own summary last),
    and when."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DISTRIBUTED_DEBUG"}
    env.update(PYTHONUNBUFFERED="1", PARTED_GLOO_TIMEOUT=str(gloo_timeout))
    if debug:
        env["TORCH_DISTRIBUTED_DEBUG"] = debug
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), str(job)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    first, first_at, lines, in_thread = None, None, [], None
    try:
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() - t0 < limit:
            if not sel.select(timeout=0.5):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            text = line.strip()
            m = re.match(r"^(?:\[rank\d+\]:\s*)?Exception in thread (.+?):?$", text)
            if m:  # the error itself is on a line that follows
                in_thread = m.group(1)
                continue
            if (first is None and _ERR.search(text) and not _NOISE.search(text)
                    and "ChildFailedError" not in text and "torch.distributed.elastic" not in text
                    and not text.startswith("warnings.warn")):
                first, first_at = text, time.monotonic() - t0
                if in_thread:
                    first = f"(in thread {in_thread}) {text}"
        try:
            proc.wait(timeout=max(0.1, min(5.0, limit - (time.monotonic() - t0))))
        except subprocess.TimeoutExpired:
            pass
        timed_out = proc.poll() is None
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        _kill([proc])
    if first is None:  # torchrun's summary, if that is all there is
        first = next((ln.strip() for ln in lines if "ChildFailedError" in ln
                      or "exitcode" in ln), None)
    return {"first_error": first, "time": first_at, "timed_out": timed_out,
            "returncode": proc.returncode,
            "output": lines if len(lines) <= 400 else lines[:300] + ["..."] + lines[-100:]}


def run_case(name: str, case: Case, args) -> dict:
    job = PARTED / f"{case.job}.py"
    tmp = Path(tempfile.mkdtemp(prefix=f"partedcmp-{case.job}-{case.nproc}-"))
    try:
        (tmp / "dd").mkdir()
        dd = dd_side(job, case.nproc, tmp / "dd", None)
        try:
            live = json.loads((tmp / "dd" / "run" / "findings.json").read_text())["findings"]
        except (OSError, ValueError, KeyError):
            live = []
        if name in args.torch_saved:  # torch's tools on the same job, from an earlier run
            saved = args.torch_saved[name]
            return _row(name, case, dd, live, saved["detail"], saved["torchfrtrace"],
                        saved["distdoctor"])
        old = os.environ.get("PARTED_GLOO_TIMEOUT")
        os.environ["PARTED_GLOO_TIMEOUT"] = str(args.gloo_timeout)
        try:
            (tmp / "fr").mkdir()
            fr = fr_side(job, case.nproc, tmp / "fr", args.fr_timeout)
        finally:
            if old is None:
                os.environ.pop("PARTED_GLOO_TIMEOUT", None)
            else:
                os.environ["PARTED_GLOO_TIMEOUT"] = old
        detail = detail_side(job, case.nproc, args.gloo_timeout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    v = fr["verdict"]
    return _row(name, case, dd, live, detail, {
        "summary": v.summary(), "ranks": list(v.ranks), "seq": v.seq, "op": v.op,
        "frames": v.frames, "time_s": fr["time"],
        "raw": fr["raw"].summary() if fr["raw"] else None,
        "distdoctor_fr_dump": fr["ours_on_dump"]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="",
                    help="comma-separated: JOB (every rank count) or JOB@N (default: all)")
    ap.add_argument("--out", default="", help="also write every result to this JSON file")
    ap.add_argument("--fr-timeout", type=float, default=10.0,
                    help="the Flight Recorder shim's watchdog timeout (s)")
    ap.add_argument("--gloo-timeout", type=float, default=30.0,
                    help="the jobs' gloo timeout in the bare runs (DETAIL, Flight Recorder)")
    ap.add_argument("--rescore", default="", metavar="FILE.json",
                    help="run nothing: score the runs saved in FILE.json (an --out) again")
    ap.add_argument("--torch-from", default="", metavar="FILE.json",
                    help="take torch's tools' answers (and the distdoctor there, as 'before') "
                         "from an earlier --out: run only distdoctor")
    args = ap.parse_args()
    args.torch_saved = ({r["case"]: r for r in json.loads(Path(args.torch_from).read_text())
                         ["results"]} if args.torch_from else {})
    args.out = str(Path(args.out).resolve()) if args.out else ""
    args.rescore = str(Path(args.rescore).resolve()) if args.rescore else ""
    # run everything from a neutral directory: `python -m distdoctor` puts the working
    # directory first on sys.path, and from the checkout that would shadow a distdoctor
    # put first on PYTHONPATH (all paths here are absolute)
    os.chdir(tempfile.gettempdir())
    wanted, wanted_given = [], bool(args.cases)
    for item in [c for c in args.cases.split(",") if c] or list(CASES):
        hits = [k for k in CASES if k == item or k.split("@")[0] == item]
        if not hits:
            ap.error(f"unknown case {item!r}; known: {', '.join(CASES)}")
        wanted += [h for h in hits if h not in wanted]
    if args.rescore:
        saved = json.loads(Path(args.rescore).read_text())
        rows = [r for r in saved["results"] if not wanted_given or r["case"] in wanted]
        for r in rows:  # the same runs, scored by the rules as they are now
            s = score(CASES[r["case"]], r["distdoctor"]["findings"])
            r["distdoctor"]["culprit"], r["distdoctor"]["line"] = s["culprit"], s["line"]
        where, fr_timeout, gloo = saved["distdoctor"], saved["fr_timeout"], saved["gloo_timeout"]
    else:
        rows = []
        for name in wanted:
            t0 = time.monotonic()
            rows.append(run_case(name, CASES[name], args))
            print(f"{name}: done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        where = str(Path(distdoctor.__file__).resolve().parent.parent)
        fr_timeout, gloo = args.fr_timeout, args.gloo_timeout
    print(render(rows, where, fr_timeout, gloo))
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"distdoctor": where, "fr_timeout": fr_timeout, "gloo_timeout": gloo,
             "cases": {r["case"]: asdict(CASES[r["case"]]) for r in rows},
             "results": rows}, indent=1, default=str))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
