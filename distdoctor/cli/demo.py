"""See distdoctor at work: the reference hybrid-parallel trainer, traced, with live findings.

  distdoctor demo                                   # 8 CPU ranks: DP x TP x PP with MoE/EP
  distdoctor demo --inject mismatch:rank=3,step=5   # rank 3 broadcasts where others reduce
  distdoctor demo --inject hang:rank=6,step=4 --hang-timeout 10
  distdoctor demo --inject throttle:rank=6,factor=1.5 --steps 200

It is `distdoctor run --nproc N -- python -m distdoctor.reference_trainer ...` with degrees
chosen for N (printed first, so you can run or change it yourself). Injection kinds:
straggler, mismatch, shape, skip, hang, crash, slowlink, throttle (see
`python -m distdoctor.reference_trainer --help`).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from distdoctor.errors import UserError


def register(sub) -> None:
    p = sub.add_parser("demo", help="the reference trainer under tracing, live findings",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, metavar="N",
                   help="ranks (default: the GPUs here, or 8 CPU ranks without a GPU)")
    p.add_argument("--steps", type=int, default=50, help="training steps (50)")
    p.add_argument("--inject", action="append", default=[], metavar="KIND:key=val,...",
                   help="inject a failure (repeatable)")
    p.add_argument("--hang-timeout", type=float, default=15.0, metavar="S",
                   help="seconds in flight that make a hang (15 for the demo)")
    p.add_argument("--on-hang", choices=["report", "kill"], default="kill",
                   help="stop the job once a hang is diagnosed (kill)")
    p.add_argument("--run-dir", metavar="DIR", help="where to write (default: a new dir "
                   "under ./distdoctor-runs)")
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
    if nproc < 1:
        raise UserError("demo: --nproc must be at least 1", 2)
    if args.steps < 1:
        raise UserError("demo: --steps must be at least 1", 2)
    if args.hang_timeout <= 0:
        raise UserError("demo: --hang-timeout must be positive", 2)
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
    err_console.print(f"[bold]distdoctor demo[/]: {shlex.join(shown)}")
    err_console.print("[dim]the dashboard, from another terminal: distdoctor watch"
                      f"{' ' + shlex.quote(args.run_dir) if args.run_dir else ''}[/]")
    run_args = argparse.Namespace(nproc=nproc, run_dir=args.run_dir,
                                  hang_timeout=args.hang_timeout, on_hang=args.on_hang,
                                  stacks="culprits", grace=5.0, cmd=trainer)
    return run_cmd.run(run_args)
