"""Arguments several subcommands share, worded (and checked) in one place."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

# what --hang-timeout's value means is the detectors' rule; the flag is worded here
from distdoctor.diagnosis.hangs.progress import AUTO
from distdoctor.diagnosis.hangs.progress import hang_timeout_s as hang_timeout_s
from distdoctor.errors import UserError
from distdoctor.safetext import printable


def add_run_dir(parser) -> None:
    parser.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                        help="run directory (default: newest under ./distdoctor-runs)")


def add_incarnation(parser) -> None:
    parser.add_argument("--incarnation", type=int, metavar="K",
                        help="which launch of the ranks, when they started more than once "
                        "(0 is the first; default: the newest)")


def read_incarnation(args, who: str, ranks: list[int] | None = None):
    """The run's incarnation asked for with --incarnation (default: the newest)."""
    from distdoctor.errors import UserError
    from distdoctor.runlog.run import read_run

    if args.incarnation is not None and args.incarnation < 0:
        raise UserError(f"{who}: --incarnation must be 0 or more", 2)
    return read_run(args.run_dir, ranks=ranks, incarnation=args.incarnation)


def incarnation_line(run_, who: str) -> str | None:
    """What a reader of one incarnation is told when the run holds several."""
    if run_.incarnations <= 1:
        return None
    return (f"{run_.label} of 0-{run_.incarnations - 1} (the ranks started "
            f"{run_.incarnations} times; pick one with `distdoctor {who} --incarnation K`)")



def hang_timeout_arg(text: str) -> float | str:
    """`--hang-timeout auto|S`: "auto" (hangs decided by progress) or seconds."""
    if text.strip().lower() == AUTO:
        return AUTO
    value = _number(text)
    if not 0 < value < math.inf:  # nan, inf, 0 and less: every command that takes it
        raise _bad_value(f"expected 'auto' or a positive number of seconds, got {text!r}")
    return value


def add_run_hang_timeout(parser) -> None:
    """--hang-timeout for a command that reads a run: the run's own is the default."""
    parser.add_argument("--hang-timeout", type=hang_timeout_arg, metavar="auto|S",
                        help="how a wait becomes a hang: 'auto' (by progress) or a fixed "
                        "number of seconds in flight (default: the run's own)")


def seconds_arg(text: str) -> float:
    """A duration flag's type: a positive, finite number of seconds. float() takes "nan"
    and "inf", and nan passes every `<= 0` test (`check --timeout nan` failed every rank
    at once; a nan wait never ends)."""
    value = _number(text)
    if not 0 < value < math.inf:
        raise _bad_value(f"expected a positive number of seconds, got {text!r}")
    return value


def grace_arg(text: str) -> float:
    """--grace: seconds, 0 included (stop at once)."""
    value = _number(text)
    if not 0 <= value < math.inf:
        raise _bad_value(f"expected seconds (0 or more), got {text!r}")
    return value


def _number(text: str) -> float:
    """float(text), nan for what is not a number (refused with the rest)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def _bad_value(message: str) -> Exception:
    import argparse

    return argparse.ArgumentTypeError(message)


def output_file(dest: str, flag: str, command: str) -> Path:
    """A file the user names for distdoctor to write: written under a temporary name and
    renamed over it, so what is there must be a regular file or nothing. A device or a
    FIFO would be replaced by a file (as root, `--perfetto /dev/null` replaced the
    machine's /dev/null); an empty name or a directory has no file name to rename to."""
    path = Path(dest)
    if not dest.strip():
        raise UserError(f"{command}: {flag} needs a file name", 2)
    if not path.name or dest.endswith(os.sep) or path.is_dir():
        raise UserError(f"{command}: {flag} {dest!r} is a directory; give the file to write",
                        2)
    try:
        st = os.stat(path)
    except OSError:
        return path  # nothing there yet (a missing directory is said when writing)
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{command}: {flag} {printable(dest)} is not a regular file (a "
                        "device, FIFO or socket); distdoctor writes a new file and renames it "
                        "into place, which would replace it", 2)
    return path


def add_tls(parser) -> None:
    """--tls-cert/--tls-key/--tls-ca for a command that opens a network endpoint (the
    environment's DISTDOCTOR_TLS_* otherwise: collect/tls.py)."""
    parser.add_argument("--tls-cert", metavar="PEM", help="TLS certificate: a server's "
                        "(/metrics), or this node's client certificate for --forward "
                        "($DISTDOCTOR_TLS_CERT)")
    parser.add_argument("--tls-key", metavar="PEM", help="its private key "
                        "($DISTDOCTOR_TLS_KEY)")
    parser.add_argument("--tls-ca", metavar="PEM", help="the CA that signed the "
                        "collector's certificate; on /metrics, scrapers' client "
                        "certificates signed by it are then required ($DISTDOCTOR_TLS_CA)")


def tls_settings(args):
    from distdoctor.collect.tls import settings

    return settings(args.tls_cert, args.tls_key, args.tls_ca)
