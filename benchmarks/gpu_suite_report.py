"""The GPU suite's summary: one JSON and one Markdown file, the overhead goals judged.

A goal is judged only where it can be: on the full size, with at least two cores per rank
(a rank's thread and its backend's worker each get a core, so the ratio is the tracer's
cost and not a fight for cores). Elsewhere its value is shown and its verdict is
"undecided", with the reason. A skipped stage is never counted as passed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

FORMAT, VERSION = "distdoctor-gpu-suite", 1
STEP_GOAL, PAIRED_GOAL = 1.02, 1.05  # the "never harm the job" issue's bounds


def junit_cases(root) -> list[dict]:
    """pytest's JUnit XML as [{"id", "outcome", "seconds", "message"}]."""
    cases = []
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (el.get("message") or el.text or "").strip()
                break
        module = case.get("classname", "").rsplit(".", 1)[-1]
        cases.append({"id": f"{module}::{case.get('name')}" if module else case.get("name"),
                      "outcome": outcome,
                      "seconds": round(float(case.get("time") or 0), 1),
                      "message": message.splitlines()[0][:300] if message else ""})
    return cases


def _verdict(value: float, limit: float, ranks: int, facts: dict, size: str) -> tuple:
    cpus = facts.get("cpus") or 0
    if size != "full":
        return "undecided", f"{size} size (a dry run): plumbing only"
    if cpus < 2 * ranks:
        return "undecided", f"{cpus} cores for {ranks} ranks: fewer than two per rank"
    return ("met" if value <= limit else "not met"), f"{cpus} cores, {ranks} ranks"


def goals(facts: dict, stages: list[dict], size: str) -> list[dict]:
    out = []
    for st in stages:
        for row in st.get("modes", []):
            if row.get("status") == "ran":
                verdict, why = _verdict(row["traced_off"][0], STEP_GOAL, row["ranks"], facts,
                                        size)
                out.append({"goal": f"step time traced/off <= {STEP_GOAL}",
                            "what": row["mode"], "value": row["traced_off"][0],
                            "interval": row["traced_off"][1:], "verdict": verdict, "why": why})
        if st["name"] == "paired" and "ratio_median" in st:
            verdict, why = _verdict(st["ratio_median"], PAIRED_GOAL, 2, facts, size)
            out.append({"goal": f"paired all_reduce traced/plain <= {PAIRED_GOAL}",
                        "what": "2 gloo ranks, 1 element", "value": st["ratio_median"],
                        "interval": [st["ratio_q1"], st["ratio_q3"]], "verdict": verdict,
                        "why": why})
    return out


def exit_code(stages: list[dict], cpu_only: bool) -> int:
    if any(st["status"] not in ("passed", "skipped") for st in stages):
        return 1  # failed, stopped at the budget, or not run
    if any(st["status"] == "skipped" for st in stages) and not cpu_only:
        return 3  # the GPU parts were asked for and did not run
    return 0


def build(facts: dict, install: str, stages: list[dict], cpu_only: bool, size: str,
          started: float, work: Path) -> dict:
    return {"format": FORMAT, "version": VERSION,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "wall_s": round(time.time() - started, 1), "cpu_only": cpu_only, "size": size,
            "machine": facts, "install": install, "work_dir": str(work), "stages": stages,
            "goals": goals(facts, stages, size), "exit_code": exit_code(stages, cpu_only)}


def merge(summaries: list[dict]) -> dict:
    """Several calls' summaries as one: every stage (a later run of a stage replaces an
    earlier one), the goals judged again, the first machine's facts."""
    by_name: dict[str, dict] = {}
    for s in summaries:
        for st in s["stages"]:
            by_name[st["name"]] = st
    first = summaries[0]
    stages = list(by_name.values())
    size = "full" if all(s["size"] == "full" for s in summaries) else "tiny"
    cpu_only = any(s["cpu_only"] for s in summaries)
    return {**first, "stages": stages, "size": size, "cpu_only": cpu_only,
            "wall_s": sum(s["wall_s"] for s in summaries),
            "merged_from": [s["started"] for s in summaries],
            "goals": goals(first["machine"], stages, size),
            "exit_code": exit_code(stages, cpu_only)}


def write(out: Path, summary: dict) -> int:
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = markdown(summary)
    (out / "summary.md").write_text(text)
    print(text, flush=True)
    return summary["exit_code"]


# --- Markdown ---------------------------------------------------------------------------
def _table(head: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c).replace("|", "/") for c in r) + " |" for r in rows]
    return lines + [""]


def _ratio(r) -> str:
    return f"{r[0]:.3f} ({r[1]:.2f}-{r[2]:.2f})" if r else "-"


def markdown(s: dict) -> str:
    m = s["machine"]
    gpus = ", ".join(m.get("gpus") or []) or "none"
    lines = [f"# distdoctor GPU suite, {s['started']}", "",
             f"{'Dry run (--cpu-only, ' + s['size'] + ' size): CUDA parts skipped. ' if s['cpu_only'] else ''}"
             f"{m.get('cpus')} CPU cores; GPUs: {gpus}; driver {m.get('driver') or '-'} "
             f"(CUDA {m.get('driver_cuda') or '-'}); torch {m.get('torch')} (CUDA "
             f"{m.get('torch_cuda')}, NCCL {m.get('nccl_version') or '-'}); Python "
             f"{m.get('python')}; {s['install']}. Missing: {', '.join(m.get('missing') or []) or 'none'}."
             f" Exit code {s['exit_code']}, {s['wall_s']:.0f} s"
             f"{' over ' + str(len(s['merged_from'])) + ' calls' if s.get('merged_from') else ''}.",
             ""]
    lines += _table(["stage", "status", "s", "why"],
                    [[st["name"], st["status"], f"{st['wall_s']:.0f}",
                      "; ".join(filter(None, [st.get("reason"), st.get("cuda_skipped")]))]
                     for st in s["stages"]])
    for st in s["stages"]:
        if st.get("tests"):
            lines += ["## GPU tier (tests/gpu)", ""]
            lines += _table(["test", "outcome", "s", "message"],
                            [[t["id"], t["outcome"], t["seconds"], t["message"]]
                             for t in st["tests"]])
        measured: dict[str, list[dict]] = {}
        for rec in st.get("measurements", []):
            measured.setdefault(rec["test"], []).append(rec)
        for name, recs in measured.items():
            keys = [k for k in recs[0] if k != "test"]
            lines += [f"### {name}", ""]
            lines += _table(keys, [[r.get(k, "") for k in keys] for r in recs])
        if st.get("nvml_fixtures"):
            lines += ["NVML recordings written (commit them under "
                      f"tests/fixtures/nvml_recorded/): {', '.join(st['nvml_fixtures'])}", ""]
        if st.get("modes"):
            lines += [f"## {st['name']}: step-time overhead (step_overhead.py, CPU, gloo)", ""]
            lines += _table(["mode", "ranks", "off ms", "traced/off", "recorder/off",
                             "traced/recorder", "launched run/bare", "s"],
                            [[r["mode"], r.get("ranks", ""), f"{r['off_ms']:.1f}",
                              _ratio(r["traced_off"]), _ratio(r["recorder_off"]),
                              _ratio(r["traced_recorder"]), _ratio(r["launched"]),
                              r["wall_s"]] if r["status"] == "ran" else
                             [r["mode"], "", "", r["status"], r.get("reason", ""), "", "",
                              r.get("wall_s", "")] for r in st["modes"]])
        if "ratio_median" in st:
            lines += ["## paired: all_reduce of 1 element, 2 gloo ranks (tracer_overhead.py)",
                      "", f"traced/plain median {st['ratio_median']:.3f} (quartiles "
                      f"{st['ratio_q1']:.3f}-{st['ratio_q3']:.3f}) over "
                      f"{len(st['launches'])} launches of {st['rounds']} x 2 blocks of 100 ops",
                      ""]
    if s["goals"]:
        lines += ["## Goals", ""]
        lines += _table(["goal", "what", "value (interval)", "verdict", "why"],
                        [[g["goal"], g["what"], f"{g['value']:.3f} ({g['interval'][0]:.3f}-"
                          f"{g['interval'][1]:.3f})", g["verdict"], g["why"]]
                         for g in s["goals"]])
    return "\n".join(lines)
