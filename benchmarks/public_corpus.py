"""The public corpus (issue 41): every case under distdoctor and beside torch's own tools.

The corpus (`../shared/corpus/` beside the checkout, or --corpus DIR; a fast subset is
copied into tests/jobs/corpus/ for CI) holds real bugs from the public record, r01-r40
(`real/`, each with its expectations in a .json beside it), and small jobs h01-h18
(`cases/`, expectations in check.py's EXPECT table). Each case runs on gloo, one tool
at a time:

1. distdoctor: `distdoctor run --nproc N --on-hang kill` with no hang timeout (hangs by
   progress), judged post-mortem by the corpus's own checker (check_real.py / check.py):
   the culprit, the line; the time is when the first error finding was on disk.
2. TORCH_DISTRIBUTED_DEBUG=DETAIL under torchrun, bare (60 s at most): its first error
   line. A culprit counts when that line names the culprit ranks and no other; the line
   counts when the output holds a traceback frame at the culprit's marked line.
3. The Flight Recorder with torchfrtrace (benchmarks/fr_comparison.py's shim: a dump at
   a hang from a watchdog after --fr-timeout s, or at exit): the ranks and frames it
   names.
4. A plain timeout: the bare job under torchrun; what torch prints when the case's own
   process-group timeout (or its crash) ends it: the same rules as DETAIL.

Times run from the launch of the ranks to the answer: each case's faults come within a
second or two of its start, so the column is dominated by how long each tool waits.
Healthy expectations (h11) count as right when a tool says nothing.

A bare tool's culprit counts when its first error message names exactly the culprit
ranks (the `[rankN]:` prefix of who printed it does not count), and its line when, beside
that, the output holds a traceback frame at the marked line.

  python benchmarks/public_corpus.py [--corpus DIR] [--cases r08,h16] [--tools
      distdoctor,detail,fr,timeout] [--out FILE.json]
  python benchmarks/public_corpus.py --render A.json B.json   # merged, no runs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from fr_comparison import dd_side, fr_side  # noqa: E402  (one runner of each tool)
from parted_comparison import detail_side  # noqa: E402

TOOLS = ("distdoctor", "detail", "fr", "timeout")
_RANK = re.compile(r"\b[Rr]ank\s*\[?(\d+)\]?")


def _corpus(path: str) -> Path:
    for cand in ([Path(path)] if path else [ROOT.parent / "shared" / "corpus",
                                             ROOT / "tests" / "jobs" / "corpus"]):
        if (cand / "check.py").exists():
            return cand.resolve()
    raise SystemExit("public_corpus: no corpus found (give --corpus DIR holding check.py)")


def cases(corpus: Path) -> dict[str, dict]:
    """name -> {path, nproc, culprits, line, judge}: the corpus's own expectations."""
    sys.path.insert(0, str(corpus))
    import check  # the corpus's checker: its EXPECT table and judge
    import check_real
    out = {}
    for path in sorted((corpus / "real").glob("r*.py")):
        meta = json.loads(path.with_suffix(".json").read_text())
        out[path.name[:3]] = {
            "path": path, "nproc": meta["nproc"], "culprits": meta.get("culprit_ranks") or [],
            "line": check.marker_line(path, "EXPECT-CULPRIT") if meta.get("check_line")
            else None, "judge": (lambda rep, m=meta, p=path: check_real.judge(m, p, rep))}
    for path in sorted((corpus / "cases").glob("h*.py")):
        name = path.name[:3]
        if name not in check.EXPECT:
            continue
        nproc, _kinds, culprits, check_line, extra = check.EXPECT[name]
        out[name] = {
            "path": path, "nproc": nproc, "culprits": sorted(culprits),
            "line": check.marker_line(path, "EXPECT-CULPRIT") if check_line else None,
            "healthy": extra == "clean",
            "judge": (lambda rep, n=name, p=path: check.judge(n, p, rep))}
    return out


def _named_ranks(text: str | None) -> set[int]:
    """The ranks an error message names, not the `[rankN]:` prefix of who printed it."""
    text = re.sub(r"^\s*\[rank\d+\]:\s*", "", text or "")
    return {int(m) for m in _RANK.findall(text)}


def _bare_cell(first: str | None, lines: list[str], case: dict) -> tuple[bool, bool]:
    """(culprit named, line named) for a bare run's output."""
    want = set(case["culprits"])
    if case.get("healthy"):
        return first is None, True
    named = _named_ranks(first)
    culprit = bool(want) and named == want
    # a traceback through the marked line counts only beside a message that named the
    # culprit: every rank's traceback passes through some line
    line = culprit and case["line"] is not None and any(
        f'{case["path"].name}", line {case["line"]}' in ln for ln in lines)
    return culprit, line


def timeout_side(job: Path, nproc: int, limit: float = 90.0) -> dict:
    """The bare job under torchrun: its first error line, when the case's own timeout
    (or crash) ends it; DETAIL's runner without DETAIL."""
    return detail_side(job, nproc, gloo_timeout=30.0, limit=limit, debug=None)


def run_case(name: str, case: dict, tools, fr_timeout: float) -> dict:
    row = {"case": name, "nproc": case["nproc"], "culprits": case["culprits"],
           "line": case["line"]}
    tmp = Path(tempfile.mkdtemp(prefix=f"pubcorpus-{name}-"))
    try:
        if "distdoctor" in tools:
            (tmp / "dd").mkdir()
            dd = dd_side(case["path"], case["nproc"], tmp / "dd", None)
            ok, why = case["judge"]({"findings": dd["findings"]})
            first = next((f for f in dd["findings"] if f["severity"] == "error"), None)
            row["distdoctor"] = {"right": ok, "culprit": ok or "line" in why,
                                 "line_ok": ok, "why": why, "time": dd["time"],
                                 "said": (first or {}).get("summary", "")[:300]}
        for tool in ("detail", "timeout"):
            if tool not in tools:
                continue
            side = (detail_side(case["path"], case["nproc"], 30.0) if tool == "detail"
                    else timeout_side(case["path"], case["nproc"]))
            culprit, line = _bare_cell(side["first_error"], side["output"], case)
            row[tool] = {"culprit": culprit, "line_ok": line, "right": culprit and (
                line or case["line"] is None), "time": side["time"],
                "said": (side["first_error"] or "")[:300]}
        if "fr" in tools:
            (tmp / "fr").mkdir()
            fr = fr_side(case["path"], case["nproc"], tmp / "fr", fr_timeout)
            v = fr["verdict"]
            culprit = (v.kind == "none") if case.get("healthy") else (
                bool(case["culprits"]) and set(v.ranks) == set(case["culprits"]))
            line = case["line"] is not None and any(
                str(f).endswith(case["path"].name) and ln == case["line"]
                for _, f, ln in v.frames)
            row["fr"] = {"culprit": culprit, "line_ok": line,
                         "right": culprit and (line or case["line"] is None),
                         "time": fr["time"], "said": v.summary()[:300]}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return row


def _pct(values: list[float], q: float) -> str:
    if not values:
        return "-"
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return f"{values[k]:.0f} s"


def render(rows: list[dict], tools) -> str:
    out = ["| tool | right culprit | right line (where the case marks one) | right (both) | "
           "time to the answer, p50 / p90 |", "|---|---|---|---|---|"]
    names = {"distdoctor": "distdoctor (run, no hang timeout)",
             "detail": "TORCH_DISTRIBUTED_DEBUG=DETAIL", "fr": "Flight Recorder + torchfrtrace",
             "timeout": "plain timeout (torch's own error)"}
    for tool in tools:
        got = [r[tool] for r in rows if tool in r]
        marked = [r[tool] for r in rows if tool in r and r["line"] is not None]
        times = [g["time"] for g in got if g.get("time") is not None]
        out.append(f"| {names[tool]} | {sum(g['culprit'] for g in got)}/{len(got)} | "
                   f"{sum(g['line_ok'] for g in marked)}/{len(marked)} | "
                   f"{sum(g['right'] for g in got)}/{len(got)} | "
                   f"{_pct(times, 0.5)} / {_pct(times, 0.9)} |")
    out += ["", "| case | culprit | " + " | ".join(tools) + " |",
            "|---|---|" + "---|" * len(tools)]
    for r in rows:
        cells = []
        for tool in tools:
            g = r.get(tool)
            if g is None:
                cells.append("-")
                continue
            mark = "right" if g["right"] else ("culprit only" if g["culprit"] else "wrong")
            t = f", {g['time']:.0f} s" if g.get("time") is not None else ""
            cells.append(f"{mark}{t}")
        out.append(f"| {r['case']} | {','.join(map(str, r['culprits'])) or '-'} | "
                   + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="", help="the corpus folder (holding check.py)")
    ap.add_argument("--cases", default="", help="comma-separated names (r08,h16); default all")
    ap.add_argument("--tools", default=",".join(TOOLS), help=f"some of {','.join(TOOLS)}")
    ap.add_argument("--fr-timeout", type=float, default=10.0)
    ap.add_argument("--out", default="", help="also write every result to this JSON file")
    ap.add_argument("--render", nargs="+", default=[], metavar="FILE.json",
                    help="run nothing: the table from earlier --out files, merged by case "
                         "(torch's tools in one run, distdoctor in another)")
    args = ap.parse_args()
    if args.render:
        merged: dict[str, dict] = {}
        for path in args.render:
            for r in json.loads(Path(path).read_text())["results"]:
                merged.setdefault(r["case"], {}).update(r)
        rows = list(merged.values())
        print(render(rows, [t for t in TOOLS if any(t in r for r in rows)]))
        return
    tools = [t for t in args.tools.split(",") if t]
    if not tools or set(tools) - set(TOOLS):
        ap.error(f"--tools: some of {','.join(TOOLS)}")
    corpus = _corpus(args.corpus)
    known = cases(corpus)
    wanted = [c for c in args.cases.split(",") if c] or list(known)
    unknown = [c for c in wanted if c not in known]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(known)}")
    os.chdir(tempfile.gettempdir())  # no checkout on the ranks' sys.path but the installed
    rows = []
    for name in wanted:
        t0 = time.monotonic()
        rows.append(run_case(name, known[name], tools, args.fr_timeout))
        print(f"{name}: done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    print(f"corpus {corpus}; {len(rows)} case(s); tools: {', '.join(tools)}\n")
    print(render(rows, tools))
    if args.out:
        Path(args.out).write_text(json.dumps({"corpus": str(corpus), "results": rows},
                                             indent=1, default=str))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
