"""Export a run for other tools: a timeline for Perfetto, or PyTorch Flight Recorder dumps.

  distdoctor export RUN_DIR --perfetto trace.json     # then open it in https://ui.perfetto.dev
  distdoctor export --perfetto trace.json             # newest run under ./distdoctor-runs
  distdoctor export RUN_DIR --perfetto - | gzip > trace.json.gz
  distdoctor export RUN_DIR --flight-recorder fr/     # then: torchfrtrace fr/
  distdoctor export RUN_DIR --flight-recorder fr/ --fr-format json

--perfetto writes Chrome Trace Event JSON (chrome://tracing opens it too): one process per
rank, one track per process group, findings as instant events. Times are each rank's host
clock turned into wall time with the rank's clock anchors, so ranks on different hosts line
up only as well as their clocks agree (NTP: about a millisecond).

--flight-recorder writes one dump per rank, DIR/nccl_trace_rank_<rank>, in the format torch
2.13's Flight Recorder writes (pickle; or JSON with --fr-format json, as
_dump_fr_trace_json writes it). PyTorch's analyzer reads the pickles with no flags:
`python -m torch.distributed.flight_recorder.fr_trace DIR` (torchfrtrace), and so does
`distdoctor diagnose --fr-dump DIR`. DIR must be new, empty, or an earlier such export.
Exit code: 0, or 2 on bad input (no such run, unwritable FILE or DIR).
"""

from __future__ import annotations

import argparse
import sys

from distdoctor.cli import common
from distdoctor.errors import UserError
from distdoctor.safetext import printable  # paths and what the ranks wrote: text


def register(sub) -> None:
    p = sub.add_parser("export", help="timeline for ui.perfetto.dev, or Flight Recorder dumps",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_run_dir(p)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--perfetto", metavar="FILE",
                       help="write a Chrome Trace Event JSON timeline to FILE ('-': stdout)")
    where.add_argument("--flight-recorder", metavar="DIR",
                       help="write one PyTorch Flight Recorder dump per rank into DIR")
    p.add_argument("--fr-format", choices=("pickle", "json"),
                   help="Flight Recorder variant: pickle (what torchfrtrace reads; default) "
                   "or json")
    p.add_argument("--no-findings", action="store_true",
                   help="skip the diagnosis: ops and spans only (--perfetto)")
    common.add_incarnation(p)
    p.set_defaults(func=run)


def run(args) -> int:
    if args.flight_recorder is None and args.fr_format is not None:
        raise UserError("export: --fr-format goes with --flight-recorder", 2)
    if args.flight_recorder is not None and args.no_findings:
        raise UserError("export: --no-findings goes with --perfetto (a Flight Recorder dump "
                        "holds no findings)", 2)
    run_ = common.read_incarnation(args, "export")
    which = common.incarnation_line(run_, "export")
    if which:
        print(f"distdoctor: {printable(which)}", file=sys.stderr)
    if args.flight_recorder is not None:
        _flight_recorder(run_, args)
    else:
        _perfetto(run_, args)
    for rank, why in sorted(run_.unreadable.items()):
        print(f"distdoctor: rank {rank}: {printable(why)}; left out", file=sys.stderr)
    if not any(run_.events.values()):
        print(f"distdoctor: no events in {printable(run_.path)} (did any rank create a process "
              "group?)",
              file=sys.stderr)
    return 0


def _perfetto(run_, args) -> None:
    from distdoctor.export.perfetto import write_perfetto

    findings = [] if args.no_findings else _findings(run_)
    if args.perfetto != "-":  # (stdout is written as it is)
        common.output_file(args.perfetto, "--perfetto", "export")
    stats = write_perfetto(run_, findings, args.perfetto)
    where = "stdout" if args.perfetto == "-" else args.perfetto
    print(f"wrote {stats.slices} slices, {stats.findings} findings for {stats.ranks} ranks "
          f"to {where} (open in https://ui.perfetto.dev)",
          file=sys.stderr if args.perfetto == "-" else sys.stdout)


def _flight_recorder(run_, args) -> None:
    from distdoctor.export.flight_recorder import write_flight_recorder

    fmt = args.fr_format or "pickle"
    stats = write_flight_recorder(run_, args.flight_recorder, fmt)
    for op, n in sorted(stats.left_out.items()):
        print(f"distdoctor: {n} {op} op(s) left out: the Flight Recorder format cannot "
              f"pair a receive with no known peer", file=sys.stderr)
    then = ("read with: python -m torch.distributed.flight_recorder.fr_trace "
            f"{args.flight_recorder}" if fmt == "pickle"
            else "torchfrtrace reads the pickle variant only")
    print(f"wrote {stats.entries} Flight Recorder entries for {stats.ranks} ranks to "
          f"{args.flight_recorder} ({then})")


def _findings(run_) -> list:
    from distdoctor.diagnosis.postmortem import diagnose_run

    try:
        findings, _notes = diagnose_run(run_)
    except Exception as exc:  # the timeline is worth having without the findings
        print(f"distdoctor: diagnosis failed ({type(exc).__name__}: {exc}); exporting "
              f"without findings", file=sys.stderr)
        return []
    return findings
