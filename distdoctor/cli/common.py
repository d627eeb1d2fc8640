"""Arguments several subcommands share, worded (and checked) in one place."""

from __future__ import annotations

from distdoctor.errors import UserError


def add_run_dir(parser) -> None:
    parser.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                        help="run directory (default: newest under ./distdoctor-runs)")


def add_run_hang_timeout(parser) -> None:
    """--hang-timeout for a command that reads a run: the run's own is the default."""
    parser.add_argument("--hang-timeout", type=float, metavar="S",
                        help="seconds in flight that make a hang (default: the run's, or 60)")


def check_hang_timeout(value: float | None, command: str) -> None:
    if value is not None and value <= 0:
        raise UserError(f"{command}: --hang-timeout must be positive", 2)
