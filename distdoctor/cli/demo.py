"""See distdoctor at work: the reference hybrid-parallel trainer, traced, with live findings.

  distdoctor demo                                   # 8 CPU ranks: DP x TP x PP with MoE/EP
  distdoctor demo --inject mismatch:rank=3,step=5   # rank 3 broadcasts where others reduce
  distdoctor demo --inject hang:rank=6,step=4 --hang-timeout 10
  distdoctor demo --inject throttle:rank=6,factor=1.5 --steps 200

It is `distdoctor run --nproc N -- python -m distdoctor.reference_trainer ...` with degrees
chosen for N (printed first, so you can run or change it yourself). Injection kinds:
straggler, mismatch, shape, skip, hang, crash, slowlink, throttle (see
`python -m distdoctor.reference_trainer --help`).

On a terminal the job runs behind the live dashboard (`distdoctor watch`), its output
going to RUN_DIR/job.log; quitting the dashboard stops the job. Without a terminal, or
with --no-dashboard, findings are printed as they appear.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from distdoctor.cli import common
from distdoctor.errors import UserError
from distdoctor.launch.env import check_nproc
from distdoctor.safetext import for_rich, printable  # the user's paths and flags: text


def register(sub) -> None:
    p = sub.add_parser("demo", help="the reference trainer under tracing, live findings",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, metavar="N",
                   help="ranks (default: the GPUs here, or 8 CPU ranks without a GPU)")
    p.add_argument("--steps", type=int, default=50, help="training steps (50)")
    p.add_argument("--inject", action="append", default=[], metavar="KIND:key=val,...",
                   help="inject a failure (repeatable)")
    p.add_argument("--hang-timeout", type=common.seconds_arg, default=15.0, metavar="S",
                   help="seconds in flight that make a hang (15 for the demo)")
    p.add_argument("--on-hang", choices=["report", "kill"], default="kill",
                   help="stop the job once a hang is diagnosed (kill)")
    p.add_argument("--run-dir", metavar="DIR", help="where to write (default: a new dir "
                   "under ./distdoctor-runs)")
    p.add_argument("--no-dashboard", action="store_true",
                   help="print findings instead of showing the dashboard")
    p.set_defaults(func=run)


def _default_nproc() -> int:
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 1:
            return torch.cuda.device_count()
    except Exception:
        pass
    return 8


def run(args) -> int:
    from distdoctor.cli import run as run_cmd
    from distdoctor.console import err_console
    from distdoctor.reference_trainer.config import demo_degrees

    nproc = args.nproc if args.nproc is not None else _default_nproc()
    if why := check_nproc(nproc, "demo"):
        raise UserError(why, 2)
    if args.steps < 1:
        raise UserError("demo: --steps must be at least 1", 2)
    from distdoctor.reference_trainer.faults import FaultSpecError, parse_inject

    for spec in args.inject:  # said here in one line, not by every rank after its start
        try:
            parse_inject(spec)
        except FaultSpecError as exc:
            raise UserError(f"demo: {exc}", 2) from None
    # gloo/NCCL's own timeout must be longer than distdoctor's, or the transport gives
    # up (with an error that names no culprit) before the hang is diagnosed
    transport_timeout = max(60.0, 3 * args.hang_timeout)
    trainer = [sys.executable, "-m", "distdoctor.reference_trainer", *demo_degrees(nproc),
               "--steps", str(args.steps), "--timeout-s", f"{transport_timeout:g}"]
    for spec in args.inject:
        trainer += ["--inject", spec]
    shown = ["distdoctor", "run", "--nproc", str(nproc), "--hang-timeout",
             f"{args.hang_timeout:g}", "--on-hang", args.on_hang, "--",
             "python", *trainer[1:]]
    err_console.print(f"[bold]distdoctor demo[/]: {for_rich(shlex.join(shown), 4000)}")
    show = None
    if not args.no_dashboard and sys.stdin.isatty() and sys.stdout.isatty():
        from distdoctor import plugins

        show = plugins.dashboard()
    if show is not None:
        return _behind_dashboard(show, nproc, trainer, args)
    err_console.print("[dim]the dashboard, from another terminal: distdoctor watch"
                      f"{' ' + for_rich(shlex.quote(args.run_dir)) if args.run_dir else ''}[/]")
    # through run's own parser: every option of run has its default here too
    return run_cmd.run(run_cmd.parse_args([
        "--nproc", str(nproc), "--hang-timeout", f"{args.hang_timeout:g}",
        "--on-hang", args.on_hang, *(["--run-dir", args.run_dir] if args.run_dir else []),
        "--", *trainer]))


def _behind_dashboard(show, nproc: int, trainer: list[str], args) -> int:
    """`distdoctor run ...` in the background (output to RUN_DIR/job.log), the dashboard
    in front; quitting the dashboard (or closing the terminal) stops the job the way `run`
    stops one. Exit code: 0 when the user quit, else the job's."""
    import signal

    from distdoctor.console import err_console
    from distdoctor.launch.background import BackgroundRun
    from distdoctor.runlog import rundir
    from distdoctor.runlog.follow import wait_for_run_dir

    run_dir = rundir.claim_run_dir(args.run_dir, "demo")
    log_path = run_dir / "job.log"

    def closed(signum, frame):  # the terminal went away, or a kill: stop the job too
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, closed)
    job = BackgroundRun(run_dir, ["--nproc", str(nproc), "--hang-timeout",
                                  f"{args.hang_timeout:g}", "--on-hang", args.on_hang,
                                  "--", *trainer], log_path)
    shown = False
    try:
        if wait_for_run_dir(run_dir, 60) and job.running:
            shown = True
            show(run_dir, args.hang_timeout)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # the job is being stopped: let it finish
        quit_early = job.running
        code = job.stop()
    said = [line for line in log_path.read_text(errors="replace").splitlines()
            if line.startswith("distdoctor:")]
    if not shown:
        err_console.print("distdoctor demo: the job ended before the dashboard could show it")
    for line in said[-6:]:
        err_console.print(printable(line), markup=False, highlight=False)
    err_console.print(f"[dim]the job's output: {for_rich(log_path)}[/]")
    return 0 if quit_early else code
