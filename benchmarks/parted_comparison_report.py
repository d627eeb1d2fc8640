"""benchmarks/parted_comparison.py's scoring and table: whether an answer named the expected
culprit and the line where the ranks parted (a tie said as a tie, a race by its threads,
a healthy job quiet), one result row per case, and the Markdown table with its count of
cases distdoctor got right."""

from __future__ import annotations

import json
import re

from parted_comparison_cases import Case, markers

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
