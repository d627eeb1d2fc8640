"""The live loop's CPU budget counts `run`'s whole process (diagnosis/budget.py): what its
other threads use (the probe sampler, the output relays) lengthens the wait between
passes. Real threads burning real CPU (hashing: it leaves the GIL, as a relay's reads do)."""

from __future__ import annotations

import hashlib
import threading
import time

from distdoctor.diagnosis.budget import PassBudget

DATA = b"x" * (1 << 20)


def burn(seconds: float) -> None:
    """CPU on this thread for about `seconds` (of its own CPU time)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        hashlib.sha256(DATA).digest()


class Neighbour:
    """Another thread of the process using `share` of a core, in 20 ms periods."""

    def __init__(self, share: float):
        self.share, self.stop = share, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            burn(0.02 * self.share)
            self.stop.wait(0.02 * (1 - self.share))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=10)


def one_pass(budget: PassBudget, cpu_s: float, then_s: float = 0.0) -> float:
    """A pass of `cpu_s` CPU, then its wait; `then_s` of idle time before the next."""
    budget.begin()
    burn(cpu_s)
    wait = budget.wait()
    time.sleep(then_s)
    return wait


def test_alone_a_pass_is_spread_over_its_cpu_over_the_share():
    budget = PassBudget(share=0.5, min_wait_s=0.0, max_wait_s=100.0)
    waits = [one_pass(budget, 0.02, 0.04) for _ in range(6)]
    for w in waits:
        assert 0.04 * 0.9 <= w < 0.04 * 1.4, waits


def test_the_other_threads_cpu_lengthens_the_wait():
    """A neighbour at 0.35 of a core leaves 0.15 of the 0.5 share: each pass's CPU is
    spread over three times the time (alone: 0.04 s)."""
    budget = PassBudget(share=0.5, min_wait_s=0.0, max_wait_s=100.0)
    with Neighbour(0.35):
        waits = [one_pass(budget, 0.02, 0.1) for _ in range(8)]
    assert budget.others > 0.15, budget.others
    assert min(waits[3:]) > 0.04 * 1.5, waits


def test_what_ran_before_the_first_pass_is_not_counted():
    """The launcher starting the job is not what runs beside it: the first pass's wait
    is its own CPU over the share."""
    budget = PassBudget(share=0.5, min_wait_s=0.0, max_wait_s=100.0)
    with Neighbour(0.5):
        time.sleep(0.2)
    first = one_pass(budget, 0.02)
    assert first < 0.04 * 1.4, first
    assert budget.others == 0.0


def test_the_loop_keeps_a_quarter_of_the_budget_whatever_else_runs():
    """A neighbour past the whole share (a forwarder, a metrics scrape) leaves the loop a
    quarter of it: the wait is 4 times the alone wait (0.04 s), not the longest."""
    budget = PassBudget(share=0.5, min_wait_s=0.0, max_wait_s=100.0)
    with Neighbour(0.7):
        waits = [one_pass(budget, 0.02, 0.1) for _ in range(6)]
    assert budget.others > 0.5, budget.others
    for w in waits[3:]:
        assert 0.16 * 0.9 <= w < 0.16 * 1.4, waits


def test_a_process_over_its_budget_waits_the_longest_and_no_longer():
    budget = PassBudget(share=0.05, min_wait_s=0.0, max_wait_s=0.3)
    with Neighbour(0.5):
        waits = [one_pass(budget, 0.005, 0.1) for _ in range(4)]
    assert waits[-1] == 0.3, waits


def test_a_cheap_pass_waits_the_shortest():
    budget = PassBudget(share=0.5, min_wait_s=0.25, max_wait_s=2.0)
    for _ in range(2):
        budget.begin()
        assert budget.wait() == 0.25
