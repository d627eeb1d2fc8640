"""Direction in a two-rank p2p cycle (issue 48, item 4): real 3-rank gloo pipelines
(tests/jobs/parted/pipeline_send_order.py) where stages 1 and 2 deadlock, each in a send.

- the last stage sends its gradient up before it receives, from the first step: the
  other link (0 -> 1) opens with the upstream send, so rank 2 broke the order;
- the same after a forward-only evaluation pass: the link's own earlier exchanges show
  rank 2 received first there;
- a halo exchange that sends before it receives on every rank (one line, one function):
  the program is symmetric, and the finding stays a tie of both ranks (as r25 does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import JOBS, marker_sets, run_cli

JOB = JOBS / "parted" / "pipeline_send_order.py"


def _deadlock(kind: str, run_dir: Path) -> dict:
    proc = run_cli(["run", "--nproc", "3", "--run-dir", str(run_dir), "--grace", "2",
                    "--on-hang", "kill", "--", str(JOB), kind], timeout=90, run_dir=run_dir)
    assert proc.returncode != 0, proc.stderr[-2000:]
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    said = "\n".join(f"{f['kind']} {f['severity']} {f['ranks']} {f['summary']}"
                     for f in findings)
    errors = [f for f in findings if f["severity"] == "error"]
    assert len(errors) == 1 and errors[0]["kind"] == "deadlock", said
    return errors[0]


def _broke_it(f: dict, decided_by: str) -> None:
    marks = marker_sets(JOB)
    assert f["ranks"] == [2], f["summary"]
    d = f["details"]["direction"]
    assert d["culprit"] == 2 and d["peer"] == 1 and decided_by in d["decided_by"], d
    assert d["blocked"] == {"1": "send", "2": "send"}, d
    # the culprit's line first, the other side's after it
    assert f["callsites"][0]["rank"] == 2 and f["callsites"][0]["line"] in marks["culprit"]
    assert {c["line"] for c in f["callsites"] if c["rank"] == 1} & marks["other"]
    assert f["summary"].startswith("deadlock: rank 2 broke the order of its link with "
                                   "rank 1: it sends to rank 1"), f["summary"]
    assert "before receiving from it" in f["summary"]
    # the program's arms: rank 2 is in the last stage's arm of the rank branch
    branch = f["details"]["branch"]
    assert branch["kind"] == "rank" and branch["arms"][0]["ranks"] == [2], branch


@pytest.mark.timeout(100)
def test_the_last_stage_that_sends_first_broke_the_pipeline_order(tmp_path):
    f = _deadlock("last_sends_first", tmp_path / "run")
    _broke_it(f, "other_links")
    links = f["details"]["direction"]["other_links"]
    assert links["opened"] == [{"from": 0, "to": 1}], links
    assert (links["sender_first"], links["receiver_first"]) == (1, 2), links
    assert "every other link opens with the upstream rank's send (0 → 1)" in f["summary"]


@pytest.mark.timeout(100)
def test_the_links_earlier_exchanges_show_who_changed_its_order(tmp_path):
    f = _deadlock("after_eval", tmp_path / "run")
    _broke_it(f, "earlier_exchanges")
    assert f["details"]["direction"]["earlier_exchanges"] == {"1": "send", "2": "recv"}
    assert "rank 2 received at this point and rank 1 sent" in f["summary"], f["summary"]


@pytest.mark.timeout(100)
def test_a_symmetric_exchange_stays_a_tie(tmp_path):
    """A guard more than a change: one line sends on every rank; nothing says who broke
    an order, so both ranks stay named and no direction is claimed."""
    f = _deadlock("symmetric", tmp_path / "run")
    assert f["ranks"] == [1, 2] and "direction" not in f["details"], f["summary"]
    assert {c["line"] for c in f["callsites"]} <= marker_sets(JOB)["tie"]


# --- the reading itself, on the shapes the real jobs above do not make ----------------

def _ev(rank, index, op, peer, t0, t1, line):
    from types import SimpleNamespace as NS
    return NS(rank=rank, index=index, kind="p2p", op=op, peer_global=peer, t_enter_ns=t0,
              t_end_ns=t1, group="0", seq=index, is_async=False,
              callsite={"file": "/x/pipe.py", "line": line, "function": "f"})


def _cycle(histories, a, b):
    from distdoctor.diagnosis.parting import direction
    from distdoctor.findings import Finding
    f = Finding("deadlock", "error", "deadlock: ...", [a, b], "0", 0,
                [{"rank": a, "file": "/x/pipe.py", "line": 1},
                 {"rank": b, "file": "/x/pipe.py", "line": 2}],
                details={"cycle": [a, b]})
    return direction.judge(f, histories)


def test_a_link_that_opened_the_usual_way_is_no_broken_order():
    """r25's shape (1F1B with blocking sends): on link 2-3 rank 2 sent and rank 3
    received first, as on every link; then both block in a send. The schedule deadlocks,
    nobody broke an order: both ranks stay named."""
    h = {0: [_ev(0, 0, "send", 1, 0, 10, 5)], 1: [_ev(1, 0, "recv", 0, 0, 10, 6),
                                                  _ev(1, 1, "send", 2, 11, 20, 7)],
         2: [_ev(2, 0, "recv", 1, 0, 20, 6), _ev(2, 1, "send", 3, 21, 30, 7),
             _ev(2, 2, "send", 3, 31, None, 7)],
         3: [_ev(3, 0, "recv", 2, 0, 30, 6), _ev(3, 1, "send", 2, 31, None, 9)]}
    f = _cycle(h, 2, 3)
    assert f.ranks == [2, 3] and "direction" not in f.details


def test_openings_posted_as_one_batch_say_no_order():
    """Link 0-1 opened with a batch (send and recv posted together, waited after): which
    came first says nothing of the program's order, so nothing decides link 1-2."""
    h = {0: [_ev(0, 0, "send", 1, 0, 50, 5), _ev(0, 1, "recv", 1, 1, 50, 5)],
         1: [_ev(1, 0, "recv", 0, 0, 50, 6), _ev(1, 1, "send", 0, 1, 50, 6),
             _ev(1, 2, "send", 2, 60, None, 7)],
         2: [_ev(2, 0, "send", 1, 60, None, 9)]}
    f = _cycle(h, 1, 2)
    assert f.ranks == [1, 2] and "direction" not in f.details
    # the same link opened in order (the send done before the next was posted) decides
    h[0] = [_ev(0, 0, "send", 1, 0, 10, 5), _ev(0, 1, "recv", 1, 11, 50, 5)]
    h[1] = [_ev(1, 0, "recv", 0, 0, 10, 6), _ev(1, 1, "send", 0, 40, 50, 6),
            _ev(1, 2, "send", 2, 60, None, 7)]
    f = _cycle(h, 1, 2)
    assert f.ranks == [2] and f.details["direction"]["decided_by"] == ["other_links"]


def test_a_completion_not_yet_in_the_log_still_opens_the_link():
    """CI, loaded: the deadlock was judged while rank 0's send to rank 1 still showed no
    end (its completion not yet read), though rank 1's receive of it had ended and rank 0
    had posted nothing after it; link 0-1 read as unopened and the finding stayed a tie."""
    h = {0: [_ev(0, 0, "send", 1, 0, None, 5)],
         1: [_ev(1, 0, "recv", 0, 0, 10, 6), _ev(1, 1, "send", 2, 11, None, 7)],
         2: [_ev(2, 0, "send", 1, 0, None, 9)]}
    f = _cycle(h, 1, 2)
    assert f.ranks == [2] and f.details["direction"]["decided_by"] == ["other_links"], f.summary
    # neither side done: no exchange yet, so no order
    h[1][0] = _ev(1, 0, "recv", 0, 0, None, 6)
    assert "direction" not in _cycle(h, 1, 2).details
