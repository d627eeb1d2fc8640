"""Diagnose a run: mismatched collectives, hangs and deadlocks, stragglers, crashes,
communication errors — which rank, which collective, which line.

  distdoctor diagnose                          # newest run under ./distdoctor-runs
  distdoctor diagnose RUN_DIR --json           # findings as JSON (DESIGN.md schema)
  distdoctor diagnose --log job.err            # a failed job's output, no run dir
  distdoctor diagnose --log 'slurm-42-*.out'   # one file per rank or node
  distdoctor diagnose --fr-dump /tmp/fr_trace_ # PyTorch Flight Recorder dumps

Exit code: 0 without findings of severity error, 1 with, 2 on bad input or where
distdoctor itself failed before any finding could be made (one line, no traceback). A
detector that fails is an `internal` finding (a warning): the others' findings stand, and
it does not change the exit code.
"""

from __future__ import annotations

import argparse
import json
import sys

from distdoctor.cli import common


def register(sub) -> None:
    p = sub.add_parser("diagnose", help="findings of a run (post-mortem)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_run_dir(p)
    p.add_argument("--json", action="store_true", help="print findings as JSON")
    p.add_argument("--log", metavar="FILE", action="append",
                   help="diagnose a job's output with no run dir: a file, a glob in quotes "
                        "('slurm-123-*.out'), .gz; repeatable")
    p.add_argument("--fr-dump", metavar="PREFIX",
                   help="read PyTorch Flight Recorder dumps PREFIX<rank>")
    common.add_run_hang_timeout(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from distdoctor.errors import UserError

    try:
        return _diagnose(args)
    except (UserError, BrokenPipeError):
        raise  # the CLI's own one-line answers
    except Exception as exc:  # never a traceback on any run dir (DESIGN principle 9)
        from distdoctor.diagnosis.engine.boundary import exception_text

        print(f"distdoctor: diagnose failed: {exception_text(exc)} (a bug in distdoctor; "
              "please report it with the run dir)", file=sys.stderr)
        return 2


def _diagnose(args) -> int:
    from distdoctor.findings import Finding

    findings: list[Finding] = []
    notes: list[str] = []
    sources = []
    if args.fr_dump:
        findings += _from_fr(args.fr_dump, args.hang_timeout, notes)
        sources.append(f"Flight Recorder dumps {args.fr_dump}*")
    if args.log:
        from distdoctor.logs import scan_logs

        found, read = scan_logs(args.log)
        findings += found
        sources.append(f"log {', '.join(args.log)}")
        if not found:
            notes.append(f"no known failure in {read}")
        else:
            notes.append(f"read {read}")
    if args.run_dir is not None or not (args.fr_dump or args.log):
        from distdoctor.diagnosis.postmortem import diagnose_runs
        from distdoctor.runlog.run import read_incarnations

        runs = read_incarnations(args.run_dir)
        found, run_notes = diagnose_runs(runs, args.hang_timeout)  # None: the run's
        findings += found
        notes += run_notes
        several = f" ({len(runs)} incarnations)" if len(runs) > 1 else ""
        from distdoctor.runlog.unpack import shown  # a pack: named as the user gave it

        sources.insert(0, f"run {shown(runs[0].path)}{several}")
    if args.json:
        json.dump({"findings": [f.to_json() for f in findings], "notes": notes,
                   "sources": sources}, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        from distdoctor.console import console
        from distdoctor.diagnosis.report import print_report
        from distdoctor.safetext import for_rich  # paths are the user's text, not markup

        console.print(f"[dim]diagnosis of {for_rich(', '.join(sources))}[/]")
        print_report(findings, console, notes,
                     traced=args.run_dir is not None or not (args.fr_dump or args.log))
    return 1 if any(f.severity == "error" for f in findings) else 0


MISSING_SHOWN = 8  # ranks without a dump said one by one; past it, one line for them all


def _from_fr(prefix: str, hang_timeout, notes: list[str]):
    from distdoctor.diagnosis.flight_recorder.dumps import load_fr_dumps
    from distdoctor.diagnosis.postmortem import diagnose_events
    from distdoctor.diagnosis.report import rank_ranges

    dumps = load_fr_dumps(prefix)
    missing = [r for r in dumps.unreadable if r not in dumps.files]
    for rank, why in sorted(dumps.unreadable.items()):
        if rank in dumps.files or len(missing) <= MISSING_SHOWN:
            notes.append(f"rank {rank}: {why}; its part is unknown")
    if len(missing) > MISSING_SHOWN:  # one line, not one per rank of a large world
        notes.append(f"{len(missing)} ranks have no Flight Recorder dump at {prefix}<rank> "
                     f"(ranks {rank_ranges(missing)}: did they die first?); their part is "
                     f"unknown")
    # Each dump's time stands in for a heartbeat (how long its ops had waited); an entry
    # still in flight when the dump was taken counts as hung whatever its age (dumps are
    # usually taken on a timeout), unless --hang-timeout asks for more.
    engine = diagnose_events(dumps.events, dumps.headers(), {},
                             hang_timeout if isinstance(hang_timeout, float) else 0.0,
                             members_per_op=True)  # each op's witnesses (diagnosis/flight_recorder/dumps.py)
    return engine.findings()
