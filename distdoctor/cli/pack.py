"""Pack a run dir into one file to share it: a bug report, a colleague, another machine.

  distdoctor pack                          # newest run under ./distdoctor-runs -> RUN.ddpack
  distdoctor pack RUN_DIR -o run.ddpack    # the run dir, its logs' used parts only
  distdoctor pack RUN_DIR -o run.ddpack --no-source   # without the job's source files

A run dir's event logs are sparse 64 MiB files; a pack holds what was written in them
(each log's header, strings and the slots of its events), with run.json, findings,
exits, probes, stacks and the sources the run kept, compressed and checksummed (format:
docs/run-dir.md). `diagnose`, `show`, `watch` and `export` read a pack where they take a
run dir, and give what the run dir gives. --no-source leaves the copies of the job's
files out (their hashes stay: the reader can still tell whether a file at the path is
the one the run used).

Exit code: 0, or 2 on a run dir that is not one (one line).
"""

from __future__ import annotations

import argparse
import sys
import time

from distdoctor.cli import common
from distdoctor.safetext import printable


def register(sub) -> None:
    p = sub.add_parser("pack", help="a run dir in one file, to share", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_run_dir(p)
    p.add_argument("-o", "--output", metavar="FILE",
                   help="the pack to write (default: RUN_DIR's name + .ddpack, here)")
    p.add_argument("--no-source", action="store_true",
                   help="leave the copies of the job's source files out")
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from distdoctor.errors import UserError
    from distdoctor.runlog import rundir
    from distdoctor.runlog.pack import write_pack
    from distdoctor.runlog.unpack import is_pack

    if args.run_dir is not None and is_pack(args.run_dir):
        raise UserError(f"pack: {args.run_dir} is a file (a pack already?); give a run dir")
    run_dir = Path(args.run_dir) if args.run_dir else rundir.newest_run_dir()
    out = common.output_file(args.output or f"{run_dir.resolve().name}.ddpack", "-o", "pack")
    t0 = time.monotonic()
    try:
        stats = write_pack(run_dir, out, sources=not args.no_source)
    except OSError as exc:
        raise UserError(f"pack: cannot write {out}: {exc.strerror or exc}") from None
    for note in stats.notes:
        print(f"distdoctor: pack: {printable(note)}", file=sys.stderr)  # quotes ranks' paths
    print(f"distdoctor: packed {printable(run_dir)} into {printable(out)}: "
          f"{stats.size / 1e3:,.1f} KB "
          f"({stats.logs} log(s), {stats.events:,} events, {stats.files} other file(s); "
          f"{time.monotonic() - t0:.1f} s)", file=sys.stderr)
    return 0
