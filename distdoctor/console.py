"""The shared rich consoles: results to stdout, diagnostics and errors to stderr."""

from rich.console import Console

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)
