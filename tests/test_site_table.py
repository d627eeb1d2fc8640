"""Call sites met again are found in the C core's own table (runlog/_fast.c: by the raw
words of their key, no Python object made) and name the same line as the first time:
one line called from two places is two sites, a thread's op is its own site, and more
sites than the table's first sizes survive its growth. The pure-Python fallback records
the same. One process on torch's fake backend per path (no communication)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import JOBS, marker_lines

from distdoctor.launch.env import traced_env
from distdoctor.runlog.run import read_run
from distdoctor.runlog.slots import native_module

JOB = "many_sites.py"
GENERATED = 150


def _sites(tmp_path, pure: str) -> list[dict]:
    run_dir = tmp_path / f"pure{pure}"
    env = traced_env(run_dir, {k: v for k, v in os.environ.items()
                               if not k.startswith(("DISTDOCTOR", "TORCH_"))})
    env.update(DISTDOCTOR_PURE_PYTHON=pure, DISTDOCTOR_SAMPLE_HZ="0")
    res = subprocess.run([sys.executable, str(JOBS / JOB)], env=env, capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode == 0 and "tracing continues without it" not in res.stderr, res.stderr
    (events,) = [evs for evs in read_run(run_dir).events.values()]
    return [ev.callsite for ev in events if ev.kind == "collective" and ev.op == "all_reduce"]


@pytest.mark.parametrize("pure", ["0", "1"], ids=["c", "python"])
def test_sites_met_again_name_the_same_lines(tmp_path, pure):
    if pure == "0" and native_module() is None:
        pytest.skip("the C hot path is not built")
    lines = marker_lines(JOB)
    sites = _sites(tmp_path, pure)
    per_round = 2 + GENERATED + 1
    assert len(sites) == 3 * per_round
    rounds = [sites[i * per_round:(i + 1) * per_round] for i in range(3)]
    # each site, met again, is the same site; each round's thread is a new thread, whose
    # ident the system may or may not hand out again (it did unless the old thread had
    # not quite ended when the next started: a flake on a loaded machine)
    for r in rounds:
        r[-1] = dict(r[-1])
        assert r[-1].pop("thread_id")
    assert rounds[0] == rounds[1] == rounds[2]
    first, second, *generated, threaded = rounds[0]
    for site, caller in ((first, "first caller"), (second, "second caller")):
        assert (site["line"], site["function"]) == (lines["helper"], "helper")
        assert site["callers"][0]["line"] == lines[caller]
    assert [(s["file"], s["line"], s["function"]) for s in generated] == [
        ("/generated/sites.py", 2 * i + 2, f"f{i}") for i in range(GENERATED)]
    assert threaded["line"] == lines["helper"] and threaded["thread"] == "side-thread"
    assert "thread" not in first
