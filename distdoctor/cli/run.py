"""Run a job with every rank traced, no code changes.

  distdoctor run --nproc 4 -- train.py --steps 100        # launch 4 local ranks
  distdoctor run -- torchrun --nproc-per-node 8 train.py  # wrap a launcher

With --nproc, distdoctor starts the ranks itself with torchrun's environment (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Without it, the
command is run as given and every Python process it starts is traced. Event logs go to
the run directory (default: a new one under ./distdoctor-runs).

Findings (mismatched collectives, hangs and deadlocks, stragglers, crashes) are printed
as they appear and kept current in RUN_DIR/findings.json. With --on-hang kill, the job is
stopped once a hang or deadlock is diagnosed (stacks included). Exit code: the job's, or
non-zero when distdoctor stopped it.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections import Counter
from pathlib import Path

from distdoctor.cli import common
from distdoctor.console import err_console
from distdoctor.errors import UserError
from distdoctor.launch.env import check_nproc
from distdoctor.launch.launcher_report import LauncherReport
from distdoctor.safetext import printable  # the user's paths: text, never control


def register(sub) -> None:
    p = sub.add_parser("run", help="run a job with every rank traced",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, metavar="N", help="launch N local ranks")
    p.add_argument("--run-dir", metavar="DIR", help="where to write (default: a new dir "
                   "under ./distdoctor-runs)")
    p.add_argument("--hang-timeout", type=common.hang_timeout_arg, default=common.AUTO,
                   metavar="auto|S",
                   help="auto (the default): a hang is a rank that others wait for and "
                   "that makes no progress (no CPU, no I/O, its line not moving), named "
                   "within seconds; a busy rank keeping others waiting is a long wait, "
                   "never a hang. S: the fixed rule, a collective in flight S seconds")
    p.add_argument("--on-hang", choices=["report", "kill"], default="report",
                   help="what to do once a hang or deadlock is diagnosed (report); never "
                   "done on a long wait")
    p.add_argument("--stacks", choices=["culprits", "all"], default="culprits",
                   help="whose Python stacks a hang finding carries (culprits)")
    p.add_argument("--grace", type=common.grace_arg, default=5.0, metavar="S",
                   help="seconds the other ranks get after one fails, before they are "
                   "stopped; and between SIGTERM and SIGKILL when the job is stopped (5)")
    p.add_argument("--forward", metavar="HOST:PORT",
                   help="also send this node's logs to a collector (`distdoctor watch "
                   "--listen`) for a view of every node; token: $DISTDOCTOR_TOKEN")
    p.add_argument("--forward-digest", action="store_true",
                   help="with --forward: send a digest of this node's ranks (positions, "
                   "collective signatures) instead of every event: for jobs of thousands "
                   "of ranks; the node's own run dir keeps everything")
    p.add_argument("--metrics", metavar="HOST:PORT",
                   help="serve this node's ranks as Prometheus metrics at /metrics "
                   "(loopback unless $DISTDOCTOR_TOKEN is set)")
    p.add_argument("--no-source", action="store_true",
                   help="keep no copy of the job's source files in the run dir (their "
                   "hashes only; the diagnosis reads a file then only if unchanged)")
    common.add_tls(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                   help="the training command")
    p.set_defaults(func=run)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """`distdoctor run ARGV` as its parser reads it (for commands built on run: demo)."""
    parser = argparse.ArgumentParser(prog="distdoctor")
    register(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def run(args) -> int:
    from distdoctor.launch.env import free_port, rank_env, traced_env
    from distdoctor.launch.local import Job, python_command
    from distdoctor.launch.streams import unfailing_streams
    from distdoctor.runlog import rundir

    unfailing_streams()  # for the rest of run: a reader of its output that leaves, or a
    # full disk under it, costs what run says, never the job or its exit code
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UserError("run: no command given (distdoctor run [--nproc N] -- CMD ...)", 2)
    if why := check_nproc(args.nproc, "run"):
        raise UserError(why, 2)
    forward_to, tls = None, None
    if args.forward:
        from distdoctor.collect.server import parse_address

        forward_to = parse_address(args.forward, "run --forward")
        tls = common.tls_settings(args).client_context("run")  # bad files: one line now
    elif args.forward_digest:
        raise UserError("run: --forward-digest needs --forward HOST:PORT", 2)
    metrics = None
    if args.metrics:  # bound before the run dir is made: a port in use leaves nothing
        from distdoctor.export.metrics_http import bind_metrics

        metrics = bind_metrics(args.metrics, "run", common.tls_settings(args))
    cmd = python_command(cmd)

    try:
        run_dir = rundir.claim_run_dir(args.run_dir, "run")
        rundir.write_run_meta(run_dir, launcher="distdoctor run", command=cmd,
                              nproc=args.nproc, world_size=args.nproc,
                              hang_timeout_s=common.hang_timeout_s(args.hang_timeout),
                              on_hang=args.on_hang,
                              sources="hashes" if getattr(args, "no_source", False)
                              else "copies")
    except OSError as exc:  # a full or read-only disk: the job still runs, as it would
        print(f"distdoctor: cannot write the run dir ({exc.strerror or exc}); the job runs "
              f"untraced", file=sys.stderr)
        return _run_untraced(cmd, args)
    env = traced_env(run_dir)
    if getattr(args, "no_source", False):
        from distdoctor.runlog.sources import ENV

        env[ENV] = "0"
    if args.nproc:
        port = free_port()
        commands = [(r, cmd, rank_env(env, r, args.nproc, port)) for r in range(args.nproc)]
    else:
        commands = [(None, cmd, env)]

    print(f"distdoctor: tracing into {printable(run_dir)}", file=sys.stderr)
    holder: list = []
    report = LauncherReport()
    try:
        live = _start_diagnosis(run_dir, args, holder, report)
    except RuntimeError as exc:  # "can't start new thread": a pids limit (a container's)
        raise UserError(f"run: cannot start the live diagnosis: {exc}") from None
    if metrics is not None:
        metrics.serve(live)
        print(f"distdoctor: metrics at {metrics.url}", file=sys.stderr)
    gate = _SignalGate()  # before the job starts: a signal while it starts is not lost
    try:
        job = Job.start(commands, grace_s=args.grace,
                        on_line=_reader(live, report) if live.scans_output else None,
                        run_dir=run_dir, on_stop=live.stopping)  # alive now: stopped, not crashed
    except OSError as exc:
        gate.close()
        live.stop()
        raise UserError(f"run: cannot start {cmd[0]!r}: {exc.strerror}") from None
    holder.append(job)
    stopped_for_hang = False
    terminated = None
    forwarder = None
    try:
        try:
            gate.arm(job.stop)
            forwarder = (_start_forwarder(run_dir, forward_to, args, live, tls)
                         if forward_to else None)
            while job.poll():
                if args.on_hang == "kill" and _hang_found(live):
                    err_console.print("distdoctor: stopping the job (--on-hang kill)")
                    gate.close()  # a signal now must not stop the job a second time
                    job.stop()
                    stopped_for_hang = True
                    break
                job.wait()
        except _Terminated as exc:
            terminated = exc.signum
        gate.close()
    finally:
        job.close()  # whatever happened above, nothing of the job outlives run
    exits = _write_exits(run_dir, job, live, report)
    findings = live.stop()
    if metrics is not None:
        metrics.stop()
    if forwarder is not None:
        forwarder.stop(exits)
    try:
        _summary(run_dir, job, findings)
    except (OSError, UserError) as exc:  # the run dir went away under the job
        print(f"distdoctor: no summary: {printable(exc)}", file=sys.stderr)
    if terminated is not None and terminated != signal.SIGINT:
        return 128 + terminated
    code = job.exit_code()
    return code if code or not stopped_for_hang else 1


def _run_untraced(cmd: list[str], args) -> int:
    """The job as it would run without distdoctor (still stopped whole on a signal)."""
    import os

    from distdoctor.launch.env import free_port, rank_env
    from distdoctor.launch.local import Job

    env = dict(os.environ)
    if args.nproc:
        port = free_port()
        commands = [(r, cmd, rank_env(env, r, args.nproc, port)) for r in range(args.nproc)]
    else:
        commands = [(None, cmd, env)]
    try:
        job = Job.start(commands, grace_s=args.grace)
    except OSError as exc:
        raise UserError(f"run: cannot start {cmd[0]!r}: {exc.strerror}") from None
    gate = _SignalGate()
    try:
        gate.arm(job.stop)
        while job.poll():
            job.wait()
    except _Terminated as exc:
        if exc.signum != signal.SIGINT:
            return 128 + exc.signum
    finally:
        gate.close()
        job.close()
    return job.exit_code()


def _reader(live, report):
    def on_line(rank, text) -> None:
        if rank is None:  # a wrapped launcher's output; ranks run started print no report
            report.feed(text)  # (one rank quoting torchrun's once made another a crash)
        live.feed_line(rank, text)

    return on_line


def _start_diagnosis(run_dir, args, holder: list, report):
    """The live engine; `holder` receives the Job once started (for the exit codes), and
    `report` the statuses a wrapped launcher printed for its ranks."""
    from distdoctor.diagnosis.live import LiveDiagnosis
    from distdoctor.diagnosis.report import live_line

    def exits() -> dict[int, tuple[int, bool]]:
        procs = holder[0].procs if holder else ()
        known = {p.rank: (p.exit_code, p.stopped) for p in procs
                 if p.rank is not None and p.exit_code is not None}
        if holder and not holder[0].stopped:  # after a stop, its report is of our signal
            known.update({r: (code, False) for r, (code, _pid) in list(report.exits.items())
                          if r not in known and code != -signal.SIGTERM})
        return known

    return LiveDiagnosis(run_dir, common.hang_timeout_s(args.hang_timeout), stacks=args.stacks,
                         on_finding=lambda f: err_console.print(live_line(f)),
                         exits=exits).start()


def _hang_found(live) -> bool:
    """A hang or deadlock diagnosed (a long wait is never one) in any incarnation still
    running, not only the newest (a rank's helper group is a newer one, beside the job)."""
    return any(f.kind in ("hang", "deadlock") or f.details.get("reason") == "wrong_group"
               for engine in live.running_engines() for f in list(engine.found.values()))


class _Terminated(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _SignalGate:
    """SIGTERM (a scheduler's cancel, a user's kill), SIGINT (Ctrl-C) and SIGHUP (its
    terminal closed: ranks in sessions of their own never see it) stop the ranks, then
    run winds down as at the job's end: exit codes, the last diagnosis pass and the summary
    are still written. Installed before the job starts: a signal that comes while it starts
    is kept and acted on as soon as it has (a KeyboardInterrupt there would leave the ranks
    running). One that comes during the wind-down is let pass: the ranks are stopping."""

    def __init__(self):
        self._stop = None
        self._pending: int | None = None
        self._armed = False
        self._closed = False
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._handler)

    def _handler(self, signum, frame):
        if self._armed:
            self._armed = False
            self._stop_for(signum)
            raise _Terminated(signum)
        if self._stop is None and not self._closed and self._pending is None:
            self._pending = signum

    def _stop_for(self, signum: int) -> None:
        # SIGTERM passes on to the ranks as it came; Ctrl-C and a hang-up stop them with
        # SIGTERM too
        self._stop(signum if signum == signal.SIGTERM else signal.SIGTERM)

    def arm(self, stop_job) -> None:
        """The job runs: a signal now stops it (raising `_Terminated` in the main loop)."""
        self._stop = stop_job
        if self._pending is not None:
            self._stop_for(self._pending)
            raise _Terminated(self._pending)
        self._armed = True

    def close(self) -> None:
        self._armed = False
        self._closed = True


def _start_forwarder(run_dir, address, args, live, tls):
    import os

    from distdoctor.collect.forward import Forwarder
    from distdoctor.collect.server import is_loopback

    if tls is None and not is_loopback(address[0]):
        print(f"distdoctor: run --forward: no TLS to {address[0]}: this node's data travel "
              f"in clear (the token never does: a challenge and its HMAC; set "
              f"DISTDOCTOR_TLS_CA)", file=sys.stderr)
    return Forwarder(run_dir, address, os.environ.get("DISTDOCTOR_TOKEN"), run_meta={
        "hang_timeout_s": common.hang_timeout_s(args.hang_timeout), "run_dir": str(run_dir)},
        live=live if args.forward_digest else None, tls=tls).start()


def _write_exits(run_dir, job, live, report) -> list[dict]:
    """Exit codes per process. Under a wrapped launcher only the launcher's is known, and
    those it printed for its failed ranks: the ranks the live engine saw alive when
    distdoctor stopped the job are listed as stopped, so a post-mortem does not take them
    for crashes."""
    from distdoctor.exits import signal_name
    from distdoctor.runlog import rundir

    exits = [{"rank": p.rank, "pid": p.popen.pid, "exit_code": p.exit_code,
              "signal": p.signal_name, "stopped_by_distdoctor": p.stopped} for p in job.procs]
    known = {p.rank for p in job.procs}
    if not job.stopped:
        exits += [{"rank": r, "pid": pid, "exit_code": code,
                   "signal": signal_name(-code) if code < 0 else None,
                   "stopped_by_distdoctor": False, "from": "the launcher's report"}
                  for r, (code, pid) in sorted(report.exits.items())
                  if r not in known and code != -signal.SIGTERM]  # SIGTERM: the launcher's
        known |= set(report.exits)
    exits += [{"rank": r, "pid": None, "exit_code": None, "signal": None,
               "stopped_by_distdoctor": True} for r in live.stopped_ranks() if r not in known]
    # every other process distdoctor had to signal (a launcher's workers, a daemon), and
    # the last signal it sent each: {pid, command, rank (its RANK, if any), signal}
    try:
        rundir.write_json_atomic(Path(run_dir) / "exits.json",
                                 {"stopped_by_distdoctor": job.stopped, "processes": exits,
                                  "stopped_processes": job.stopped_processes})
    except OSError as exc:  # a full disk, a deleted run dir: the exit code still tells
        print(f"distdoctor: cannot write {printable(run_dir)}/exits.json "
              f"({exc.strerror or exc})",
              file=sys.stderr)
    return exits


def _summary(run_dir, job, findings) -> None:
    from distdoctor.runlog.run import traced_summary
    from distdoctor.runlog.rundir import rank_logs

    traced = traced_summary(run_dir)
    status = "ok" if not job.failures else ", ".join(
        f"{'rank ' + str(p.rank) if p.rank is not None else 'job'} exited "
        f"{p.signal_name or p.exit_code}" for p in job.failures)
    if job.stopped and not job.failures:
        status = "stopped by distdoctor"
    print(f"distdoctor: {printable(traced)}; {status}; run dir {printable(run_dir)}",
          file=sys.stderr)
    # ranks run launched that left no event log (its disk full, its run dir unwritable):
    # what was diagnosed is of the others only, which "no findings" alone would hide
    untraced = sorted({p.rank for p in job.procs if p.rank is not None}
                      - set(rank_logs(run_dir)))
    if untraced:
        print(f"distdoctor: rank(s) {', '.join(map(str, untraced))} left no event log "
              "(tracing disabled: each rank's line above says why); nothing of theirs was "
              "diagnosed", file=sys.stderr)
    if findings:
        kinds = Counter(f.kind for f in findings)
        print(f"distdoctor: {len(findings)} finding(s): "
              f"{', '.join(f'{n} {k}' for k, n in kinds.items())}; details: distdoctor "
              f"diagnose {printable(run_dir)}", file=sys.stderr)
    else:
        print("distdoctor: no findings", file=sys.stderr)
    import shlex

    print(f"distdoctor: to share it: distdoctor pack {printable(shlex.quote(str(run_dir)))} "
          f"-o {printable(shlex.quote(Path(run_dir).name + '.ddpack'))}",
          file=sys.stderr)
