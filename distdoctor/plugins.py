"""The parts of the distribution the core may use but must not import: found through entry
points, so dependencies keep pointing one way (DESIGN.md: tui -> core, never core -> tui).

  distdoctor.commands    name -> a module with `register(subparsers)` (e.g. `watch`)
  distdoctor.dashboard   "dashboard" -> `show(run_dir, hang_timeout_s)`: the live dashboard
                         of a run dir, until the user quits it
"""

from __future__ import annotations

from collections.abc import Callable

COMMANDS = "distdoctor.commands"
DASHBOARD = "distdoctor.dashboard"


def entry_points(group: str) -> dict:
    """name -> entry point (not loaded). Looking them up costs ~50 ms the first time."""
    from importlib.metadata import entry_points as lookup

    return {ep.name: ep for ep in lookup(group=group)}


def dashboard() -> Callable | None:
    """The dashboard's `show`, or None when it is not installed or fails to load."""
    ep = entry_points(DASHBOARD).get("dashboard")
    if ep is None:
        return None
    try:
        return ep.load()
    except Exception:
        return None
