"""The `distdoctor` command: one small module per subcommand.

Each subcommand module exposes `register(subparsers)`, which adds its parser and sets
`func` to a `run(args) -> int`. Modules import torch and friends inside `run`, so
`distdoctor --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from distdoctor.errors import UserError

# Order here is the order in `--help`.
SUBCOMMANDS = ["run", "show", "diagnose", "export", "demo", "nccl-test"]


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line (no usage dump) with exit code 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UserError(f"{self.prog}: {message}", exit_code=2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="distdoctor",
        description="Diagnostics for distributed PyTorch: which rank, which collective, "
        "which line, and why.",
    )
    from distdoctor import __version__

    parser.add_argument("--version", action="version", version=f"distdoctor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"distdoctor.cli.{name.replace('-', '_')}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"distdoctor: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
