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
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]
from conftest import marker_sets  # noqa: E402  (the tests' reading of `# expect:` lines)
from fr_comparison import _kill, dd_side, fr_side  # noqa: E402  (one shim, one runner)

import distdoctor  # noqa: E402

PARTED = ROOT / "tests" / "jobs" / "parted"

# where each class comes from (public threads, 2024-2026; see CASES.md)
SRC = {
    "stray": "https://github.com/ray-project/ray/issues/56997",
    "metric": "https://github.com/Lightning-AI/torchmetrics/issues/2758",
    "threads": "https://github.com/KempnerInstitute/KempnerForge/issues/104",
    "resume": "https://github.com/KempnerInstitute/KempnerForge/pull/50",
    "nan_skip": "https://github.com/pytorch/audio/issues/3749",
    "tie": "https://github.com/NVIDIA-NeMo/Speech/pull/14380",
    "p2p_unmatched": "https://github.com/NVIDIA/nccl/issues/2130",
    "p2p_lists": "https://github.com/pytorch/torchtitan/issues/775",
    "wrong_peer": "https://github.com/pytorch/pytorch/issues/172668",
    "healthy_bcast": "https://github.com/KempnerInstitute/KempnerForge/pull/50",
    "healthy_pp": "https://github.com/pytorch/PiPPy/pull/1000",
    "healthy_thread": "https://github.com/KempnerInstitute/KempnerForge/pull/105",
    "healthy_helper": "https://github.com/ray-project/ray/pull/65838",
}


@dataclass
class Case:
    job: str
    nproc: int
    what: str
    culprits: tuple[int, ...] | str | None  # ranks | "tie" | "threads" | None (healthy)
    markers: tuple[str, ...]  # which `# expect:` lines count as the parted line
    source: str


def _cases() -> dict[str, Case]:
    out: dict[str, Case] = {}

    def add(job, ranks, what, culprits, markers, source):
        for n in ranks:
            c = culprits(n) if callable(culprits) else culprits
            out[f"{job}@{n}"] = Case(job, n, what, c, markers, SRC[source])

    add("stray_barrier_helper", (2, 4), "stray barrier in a rank-0-only helper", (0,),
        ("parted", "caller"), "stray")
    add("stray_barrier_same_helper", (2, 4), "same helper, rank-0-only caller", (0,),
        ("parted", "caller"), "stray")
    add("rank0_metric_compute", (2, 4), "rank-0-only metric compute (control)", (0,),
        ("parted", "caller"), "metric")
    add("two_threads_one_group", (2, 4), "two threads on one group", "threads",
        ("parted",), "threads")
    add("resume_branch_2rank", (2, 4), "resume branch skipped on one node",
        lambda n: (1,) if n == 2 else (2, 3), ("parted",), "resume")
    add("nan_skip_2rank", (2,), "a NaN step's tail skipped on one rank", (1,), ("parted",),
        "nan_skip")
    add("tie_setup_branch_2rank", (2,), "branch at the first op, no evidence", "tie",
        ("tie_a", "tie_b"), "tie")
    add("batched_p2p_unmatched", (2,), "batched p2p: recv without a send", (1,),
        ("parted", "went_on"), "p2p_unmatched")
    add("batched_p2p_lists_disagree", (2, 4), "batched p2p: list sizes differ",
        lambda n: (n - 1,), ("parted", "went_on"), "p2p_lists")
    add("wrong_peer", (4,), "p2p to the wrong peer", (0,), ("parted",), "wrong_peer")
    add("hazard_thread_turns_same_group", (2,), "healthy hazard: threads take turns on one group",
        None, (), "threads")
    add("healthy_rank0_broadcast_branch", (2, 4), "healthy: rank-0 broadcast branch", None,
        (), "healthy_bcast")
    add("healthy_pipeline_lines", (2, 4), "healthy: pipeline stages' own lines", None, (),
        "healthy_pp")
    add("healthy_thread_separate_group", (2, 4), "healthy: thread with its own group", None,
        (), "healthy_thread")
    add("healthy_barrier_helper_all_ranks", (2, 4), "healthy: barrier helper on all ranks",
        None, (), "healthy_helper")
    return out


CASES = _cases()


def markers(job: str) -> dict[str, set[int]]:
    return marker_sets(PARTED / f"{job}.py")


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


# --- scoring ----------------------------------------------------------------------------

def _first_error(findings: list[dict]) -> dict | None:
    return next((f for f in findings if f.get("severity") == "error"), None)


def _walk_lines(obj, job: str, out: list) -> None:
    """(rank or None, line) pairs anywhere in details.parted_at, in this job's file."""
    if isinstance(obj, dict):
        line, file = obj.get("line"), str(obj.get("file", ""))
        if isinstance(line, int) and (not file or file.endswith(job + ".py")):
            out.append((obj.get("rank"), line))
        for v in obj.values():
            _walk_lines(v, job, out)
    elif isinstance(obj, list):
        for v in obj:
            _walk_lines(v, job, out)


def _lines_of(f: dict, job: str, ranks) -> set[int]:
    got = {c.get("line") for c in f.get("callsites", [])
           if (ranks is None or c.get("rank") in ranks)
           and str(c.get("file", "")).endswith(job + ".py")}
    parted: list = []
    _walk_lines((f.get("details") or {}).get("parted_at"), job, parted)
    got |= {ln for r, ln in parted if ranks is None or r is None or r in ranks}
    return got


def score(case: Case, findings: list[dict]) -> dict:
    mk = markers(case.job)
    noisy = [f for f in findings if f.get("severity") in ("error", "warning")]
    if case.culprits is None:
        ok = not noisy
        return {"culprit": "yes" if ok else "no (" + "; ".join(
            f"{f['severity']} {f['kind']} {f.get('ranks')}" for f in noisy) + ")",
                "line": "-"}
    f = _first_error(findings)
    if f is None:
        return {"culprit": "no (no error finding)", "line": "no"}
    named = set(f.get("ranks") or [])
    # what the finding says, less the job's file name ("two_threads_...", "tie_setup_...")
    text = (f.get("summary", "") + " " + json.dumps(f.get("details") or {})).lower()
    text = text.replace(case.job.lower(), "JOB")
    if case.culprits == "tie":
        said = re.search(r"\btie\b", text) or (f.get("details") or {}).get("tie")
        culprit = ("yes (said as a tie)" if said else
                   "partly (blames both, not said as a tie)" if len(named) > 1 else
                   f"no (blames {','.join(map(str, sorted(named)))})")
        lines = _lines_of(f, case.job, None)
        want = [m for m in case.markers if mk.get(m)]
        hit = [m for m in want if mk[m] & lines]
        line = "yes (both)" if len(hit) == len(want) else (
            f"partly ({','.join(hit)})" if hit else "no")
        return {"culprit": culprit, "line": line}
    if case.culprits == "threads":
        thread = re.search(r"\bthreads?\b", text)
        said = thread and "metrics-reporter" in text
        culprit = "yes (names the threads)" if said else (
            "partly (says thread)" if thread else
            f"no (blames rank(s) {','.join(map(str, sorted(named)))})")
        lines = _lines_of(f, case.job, None)
    else:
        want = set(case.culprits)
        culprit = ("yes" if named == want else
                   f"partly ({','.join(map(str, sorted(named)))})" if named & want else
                   f"no ({','.join(map(str, sorted(named))) or '-'})")
        lines = _lines_of(f, case.job, want)
    hit = [m for m in case.markers if mk.get(m, set()) & lines]
    return {"culprit": culprit, "line": f"yes ({hit[0]})" if hit else "no"}


def _dd_cell(f: dict | None, findings: list[dict], job: str) -> str:
    if f is None:
        noisy = [g for g in findings if g.get("severity") == "warning"]
        return "no error finding" + (f" ({len(noisy)} warning(s))" if noisy else "")
    sites = ", ".join(sorted({f"r{c.get('rank')}:{c.get('line')}" for c in f.get("callsites", [])
                              if str(c.get("file", "")).endswith(job + ".py")}))
    more = sum(1 for g in findings if g.get("severity") == "error") - 1
    summary = f.get("summary", "").replace("|", "/").replace("\n", " ")
    if len(summary) > 220:
        summary = summary[:217] + "..."
    return (f"{f['kind']} ranks {f.get('ranks')}: {summary} [lines {sites or '-'}]"
            + (f" (+{more} more error finding(s))" if more > 0 else ""))


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


def _row(name: str, case: Case, dd: dict, live: list, detail: dict, frtrace: dict,
         before: dict | None = None) -> dict:
    findings = live or dd["findings"]
    first = _first_error(findings)
    s = score(case, findings)
    s_post = score(case, dd["findings"])
    row = {
        "case": name, "job": case.job, "nproc": case.nproc, "class": case.what,
        "expected_culprits": case.culprits, "expected_markers": case.markers,
        "source": case.source,
        "distdoctor": {
            "first_error": first, "cell": _dd_cell(first, findings, case.job),
            "findings": findings, "post_mortem_first_error": _first_error(dd["findings"]),
            "time_s": dd["time"], "culprit": s["culprit"], "line": s["line"],
            "post_mortem_culprit": s_post["culprit"], "post_mortem_line": s_post["line"],
            "torchfrtrace_on_export": dd["export"].summary()},
        "detail": detail,
        "torchfrtrace": frtrace,
    }
    if before is not None:  # what the earlier distdoctor said (the run torch's came from)
        row["before"] = {k: before[k] for k in ("cell", "culprit", "line")}
    return row


def _cell(text, n=160) -> str:
    text = (text or "-").replace("|", "/").replace("\n", " ")
    return text if len(text) <= n else text[: n - 3] + "..."


def _torch_frames(frames, job: str) -> str:
    mine = [ln for _, file, ln in frames if str(file).endswith(job + ".py")]
    return f" (line {mine[-1]})" if mine else ""


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


def render(rows: list[dict], where: str, fr_timeout: float, gloo: float) -> str:
    before = any("before" in r for r in rows)
    out = [f"distdoctor from {where}; torch's tools on the same jobs bare (gloo timeout "
           f"{gloo:g} s there, 120 s under distdoctor; Flight Recorder watchdog "
           f"{fr_timeout:g} s).\n",
           "| case | class | source | distdoctor says (first error finding: culprit, lines) "
           "| TORCH_DISTRIBUTED_DEBUG=DETAIL says | torchfrtrace says | expected culprit "
           "named | parted line named |" + (" before: culprit / line |" if before else ""),
           "|" + "---|" * (9 if before else 8)]
    for r in rows:
        d, det, fr = r["distdoctor"], r["detail"], r["torchfrtrace"]
        det_text = det["first_error"] or ("nothing in 60 s" if det["timed_out"] else
                                          f"nothing (exit {det['returncode']})")
        if det["time"] is not None:
            det_text = f"{det_text} ({det['time']:.0f} s)"
        out.append(f"| {r['case']} | {r['class']} | {r['source']} | {_cell(d['cell'], 420)} | "
                   f"{_cell(det_text, 220)} | "
                   f"{_cell(fr['summary'] + _torch_frames(fr['frames'], r['job']))} | "
                   f"{d['culprit']} | {d['line']} |"
                   + (f" {r['before']['culprit']} / {r['before']['line']} |" if before
                      and "before" in r else " - |" if before else ""))
    right = sum(r["distdoctor"]["culprit"].startswith("yes")
                and r["distdoctor"]["line"].startswith(("yes", "-")) for r in rows)
    out.append(f"\ndistdoctor named the expected culprit and the parted line (or, on a healthy "
               f"job, said nothing) in {right} of {len(rows)} cases.")
    return "\n".join(out)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
