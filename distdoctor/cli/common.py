"""Arguments several subcommands share, worded (and checked) in one place."""

from __future__ import annotations

# what --hang-timeout's value means is the detectors' rule; the flag is worded here
from distdoctor.diagnosis.hangs.progress import AUTO
from distdoctor.diagnosis.hangs.progress import hang_timeout_s as hang_timeout_s
from distdoctor.errors import UserError


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
    try:
        return float(text)
    except ValueError:
        import argparse

        raise argparse.ArgumentTypeError(f"expected 'auto' or seconds, got {text!r}") from None


def add_run_hang_timeout(parser) -> None:
    """--hang-timeout for a command that reads a run: the run's own is the default."""
    parser.add_argument("--hang-timeout", type=hang_timeout_arg, metavar="auto|S",
                        help="how a wait becomes a hang: 'auto' (by progress) or a fixed "
                        "number of seconds in flight (default: the run's own)")


def check_hang_timeout(value: float | str | None, command: str) -> None:
    if value is not None and value != AUTO and value <= 0:
        raise UserError(f"{command}: --hang-timeout must be 'auto' or positive", 2)


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
