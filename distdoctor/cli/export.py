"""Export a run as a timeline: one process per rank, one track per process group,
collectives and p2p ops as slices with their details, findings as instant events.

  distdoctor export RUN_DIR --perfetto trace.json     # then open it in https://ui.perfetto.dev
  distdoctor export --perfetto trace.json             # newest run under ./distdoctor-runs
  distdoctor export RUN_DIR --perfetto - | gzip > trace.json.gz

The file is Chrome Trace Event JSON (chrome://tracing opens it too). Times are each rank's
host clock turned into wall time with the rank's clock anchors, so ranks on different
hosts line up only as well as their clocks agree (NTP: about a millisecond).
Exit code: 0, or 2 on bad input (no such run, unwritable FILE).
"""

from __future__ import annotations

import argparse
import sys

from distdoctor.cli import common


def register(sub) -> None:
    p = sub.add_parser("export", help="timeline for ui.perfetto.dev", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_run_dir(p)
    p.add_argument("--perfetto", metavar="FILE", required=True,
                   help="write a Chrome Trace Event JSON timeline to FILE ('-': stdout)")
    p.add_argument("--no-findings", action="store_true",
                   help="skip the diagnosis: ops and spans only")
    common.add_incarnation(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from distdoctor.export.perfetto import write_perfetto

    run_ = common.read_incarnation(args, "export")
    which = common.incarnation_line(run_, "export")
    if which:
        print(f"distdoctor: {which}", file=sys.stderr)
    findings = [] if args.no_findings else _findings(run_)
    stats = write_perfetto(run_, findings, args.perfetto)
    for rank, why in sorted(run_.unreadable.items()):
        print(f"distdoctor: rank {rank}: {why}; left out", file=sys.stderr)
    if not any(run_.events.values()):
        print(f"distdoctor: no events in {run_.path} (did any rank create a process group?)",
              file=sys.stderr)
    where = "stdout" if args.perfetto == "-" else args.perfetto
    print(f"wrote {stats.slices} slices, {stats.findings} findings for {stats.ranks} ranks "
          f"to {where} (open in https://ui.perfetto.dev)",
          file=sys.stderr if args.perfetto == "-" else sys.stdout)
    return 0


def _findings(run_) -> list:
    from distdoctor.diagnosis.postmortem import diagnose_run

    try:
        findings, _notes = diagnose_run(run_)
    except Exception as exc:  # the timeline is worth having without the findings
        print(f"distdoctor: diagnosis failed ({type(exc).__name__}: {exc}); exporting "
              f"without findings", file=sys.stderr)
        return []
    return findings
