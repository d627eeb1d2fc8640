"""The log corpus: every fixture under tests/fixtures/logs/{real,source,field,wide} with the
diagnosis its expected.json says is right, and the judge that compares them.

`python -m tests.logcorpus` prints the score and each miss (what a new family is measured by).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

LOGS = Path(__file__).parent / "fixtures" / "logs"
SETS = ("real", "source", "field", "wide")


def cases() -> list[tuple[str, dict]]:
    out = []
    for name in SETS:
        manifest = LOGS / name / "expected.json"
        if manifest.is_file():
            for entry in json.loads(manifest.read_text()):
                out.append((name, entry))
    return out


def specs_of(name: str, entry: dict) -> list[str]:
    logs = entry["log"] if isinstance(entry["log"], list) else [entry["log"]]
    return [str(LOGS / name / p) for p in logs]


def judge(entry: dict, findings) -> list[str]:
    """What is wrong with `findings` for this case ([] = right)."""
    loud = [f for f in findings if f.severity in ("error", "warning")]
    if entry.get("quiet"):
        return [f"not quiet: {f.severity} {f.summary}" for f in loud]
    if not loud:
        return ["no finding"]
    top = loud[0]
    wrong = []
    if entry.get("kind") and top.kind != entry["kind"]:
        wrong.append(f"kind {top.kind} != {entry['kind']}")
    family = top.details.get("family")
    if entry.get("family") and family != entry["family"]:
        wrong.append(f"family {family} != {entry['family']}")
    if entry.get("ranks") is not None and sorted(top.ranks) != sorted(entry["ranks"]):
        wrong.append(f"ranks {top.ranks} != {entry['ranks']}")
    for w in entry.get("words", []):
        if w.lower() not in top.summary.lower():
            wrong.append(f"summary lacks {w!r}")
    for w in entry.get("remedy_words", []):
        if w.lower() not in (top.remedy or "").lower():
            wrong.append(f"remedy lacks {w!r}")
    if wrong:
        wrong.append(f"top: {top.kind}/{family} {top.ranks} {top.summary}")
    return wrong


def main() -> int:
    from distdoctor.logs import scan_logs

    ok = 0
    all_cases = cases()
    for name, entry in all_cases:
        try:
            wrong = judge(entry, scan_logs(specs_of(name, entry))[0])
        except Exception as exc:  # noqa: BLE001 - say which case, go on with the others
            wrong = [f"{type(exc).__name__}: {exc}"]
        ok += not wrong
        if wrong or "-v" in sys.argv:
            print(f"{'MISS' if wrong else 'ok  '} {name}/{entry['log']}: {entry['what'][:100]}")
            for w in wrong:
                print(f"       {w[:300]}")
    print(f"{ok}/{len(all_cases)} right")
    return 0


if __name__ == "__main__":
    sys.exit(main())
