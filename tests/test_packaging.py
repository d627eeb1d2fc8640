"""The package list in pyproject.toml names every package: an editable install (CI's) finds
a forgotten one anyway, a real `pip install` would not."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # 3.11+


ROOT = Path(__file__).parent.parent


def test_every_package_is_listed():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = {name: ROOT / path for name, path in tool["package-dir"].items()}
    found = set()
    for top, where in dirs.items():
        for init in where.rglob("__init__.py"):
            rel = init.parent.relative_to(where).parts
            found.add(".".join((top, *rel)))
    assert found - set(tool["packages"]) == set()
