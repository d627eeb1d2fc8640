"""What the log tests share (test_logs_*.py): the findings a person is warned of, and a
log written into the test's own directory."""

from __future__ import annotations

from pathlib import Path


def warned_of(found) -> list:
    """The findings `diagnose --log` warns of (errors and warnings), not its notes."""
    return [f for f in found if f.severity in ("error", "warning")]


def write_named(tmp_path: Path, name: str, text: str) -> str:
    """`text` as the log file `name` in `tmp_path`; its path."""
    p = tmp_path / name
    p.write_text(text)
    return str(p)
