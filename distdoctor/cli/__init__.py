"""The `distdoctor` command: one small module per subcommand.

Each subcommand module exposes `register(subparsers)`, which adds its parser and sets
`func` to a `run(args) -> int`. Modules import torch and friends inside `run`, so
`distdoctor --help` stays instant.

Layer: front ends (tests/test_layers.py), the top. May import every other part: the
other front ends it starts (launch, collect, export, check, nccltest, reference_trainer),
the views, the detectors and everything below. Commands of other parts of the
distribution (the dashboard's `watch`) come through entry points (distdoctor/plugins.py),
never an import.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys

from distdoctor.errors import UserError
from distdoctor.safetext import printable

# Order here is the order in `--help`.
SUBCOMMANDS = ["run", "show", "diagnose", "export", "pack", "demo", "nccl-test", "check"]
# Commands that read a run dir and take a pack in its place (runlog/pack.py: unpacked
# into a private temp dir for the command's life)
READS_PACKS = ("show", "diagnose", "export", "watch")
# Commands of other parts of the distribution (the dashboard's `watch`) come through
# distdoctor.plugins, so the core never imports them.


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line (no usage dump) with exit code 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UserError(f"{self.prog}: {message}", exit_code=2)


def _wants_plugins(argv: list[str]) -> bool:
    """Whether the command line may name a plugin command (or asks for help): looking
    plugins up costs ~50 ms, which `distdoctor run` does not pay."""
    command = next((a for a in argv if not a.startswith("-")), None)
    return command not in SUBCOMMANDS


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
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
    if argv is None or _wants_plugins(argv):
        from distdoctor import plugins

        for name, ep in plugins.entry_points(plugins.COMMANDS).items():
            if name in sub.choices:  # a core command's name is not a plugin's to take
                continue
            try:
                ep.load().register(sub)
            except Exception as exc:  # a broken part must not take the other commands down
                if name not in sub.choices:
                    sub.add_parser(name, help=f"(unavailable: {exc})").set_defaults(
                        func=_unavailable(name, exc))
    return parser


def _unavailable(name: str, exc: Exception):
    def run(args) -> int:
        raise UserError(f"{name} is unavailable in this installation: {exc!r}")

    return run


@contextlib.contextmanager
def _pack_read(args):
    """A pack given where a run dir goes: the command reads it made again as a run dir."""
    path = getattr(args, "run_dir", None)
    if args.command not in READS_PACKS or not path or getattr(args, "listen", None):
        yield
        return
    from distdoctor.runlog.unpack import is_pack, unpacked

    if not is_pack(path):
        yield
        return
    with unpacked(path) as run_dir, _renamed(args):
        args.run_dir = str(run_dir)
        yield


@contextlib.contextmanager
def _renamed(args):
    """The command names the pack where it names the run dir; what it says from deeper (a
    note on one of the run's files, an error) is renamed on its way out: in rich's text
    before it is laid out in lines (a long path folds), in what print() writes, in the
    error that stops the command."""
    from rich.console import Console
    from rich.markup import escape

    from distdoctor.runlog.unpack import in_json, shown

    render_str = Console.render_str

    def renamed(self, text, *a, **kw):
        markup = kw.get("markup")
        marked = self._markup if markup is None else markup
        return render_str(self, shown(text, escape if marked else None), *a, **kw)

    streams = sys.stdout, sys.stderr
    as_json = bool(getattr(args, "json", False) or getattr(args, "perfetto", None) == "-")
    Console.render_str = renamed
    sys.stdout = _Renaming(streams[0], lambda text: shown(text, in_json if as_json else None))
    sys.stderr = _Renaming(streams[1], shown)
    try:
        yield
    except UserError as exc:
        raise UserError(shown(str(exc)), exc.exit_code) from None
    finally:
        sys.stdout, sys.stderr = streams
        Console.render_str = render_str


class _Renaming:
    """A text stream whose writes pass through `rename` (the rest is the stream's own)."""

    def __init__(self, stream, rename):
        self._stream, self._rename = stream, rename

    def write(self, text: str) -> int:
        self._stream.write(self._rename(text))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        with _pack_read(args):
            return int(args.func(args) or 0)
    except UserError as exc:
        # it may quote the user's path or a file's words: printed as text
        print(f"distdoctor: error: {printable(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
