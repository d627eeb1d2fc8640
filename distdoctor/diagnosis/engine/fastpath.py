"""The engine's common ingest in C (engine/_ingest.c), set up with the engine's classes
and limits, or None: not built, DISTDOCTOR_PURE_PYTHON set, or a class no longer of the
shape the C code reads (then every event takes Engine.ingest_one, as without it)."""

from __future__ import annotations

from collections import Counter

from distdoctor.diagnosis.engine import waits as site_waits
from distdoctor.diagnosis.engine.ranks import RankState
from distdoctor.diagnosis.hangs import waits as gap_lines
from distdoctor.diagnosis.hangs.progress import LONG_WAIT_MIN_S
from distdoctor.diagnosis.mismatches import habits
from distdoctor.diagnosis.rendezvous import Rendezvous
from distdoctor.diagnosis.stragglers import stepstats, steptime, straggler, waitgraph
from distdoctor.runlog.event import Event
from distdoctor.runlog.slots import pure_python


def native_ingest(max_open: int):
    """The configured C module, or None. `max_open`: the engine's bound on open
    rendezvous (core.py's, which imports this)."""
    if pure_python():
        return None
    try:
        from distdoctor.diagnosis.engine import _ingest
    except ImportError:
        return None
    settings = {
        "MAX_OPEN": max_open, "KEEP": steptime.KEEP, "STEPS": stepstats.STEPS,
        "LONG_STEPS": stepstats.LONG_STEPS, "MAX_KEYS": steptime.MAX_KEYS,
        "MAX_GROUPS": straggler.MAX_GROUPS, "MAX_SITES": site_waits.MAX_SITES,
        "GAPS_KEEP": gap_lines.Gaps.KEEP, "GAPS_SITES": gap_lines.MAX_SITES, "Counter": Counter,
        "ALL_FIRST": habits.ALL_FIRST, "EVERY": habits.EVERY,
        "PATTERN_BASE": steptime.PATTERN_BASE, "LONG_WAIT_MIN_S": float(LONG_WAIT_MIN_S),
        "NO_WORDS": waitgraph._NO_WORDS,
        "Event": Event, "Rendezvous": Rendezvous, "RankState": RankState,
        "StepTime": steptime.StepTime, "Steps": stepstats.Steps,
        "RankSteps": steptime.RankSteps, "Pattern": steptime.Pattern}
    try:
        _ingest.configure(settings)
    except (TypeError, ValueError, KeyError):
        return None
    return _ingest
