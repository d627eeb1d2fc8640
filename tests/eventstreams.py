"""Hand-built event streams for the detectors' unit tests (test_diagnosis_units*.py): one
rank's events in order on its own clock, an engine fed them and judged once, and steps of
world collectives with a late rank or a late cohort for the straggler rules."""

from __future__ import annotations

from distdoctor.diagnosis.engine.core import Engine
from distdoctor.runlog.reader import Event

S = 1_000_000_000  # ns per second


class Stream:
    """Builds one rank's events in order, with its own clock."""

    def __init__(self, rank: int):
        self.rank, self.index = rank, 0

    def op(self, op="all_reduce", group="0", ranks=(0, 1, 2, 3), seq=0, numel=8,
           dtype="float32", t=0.0, wait=0.001, done=True, peer=None, kind="collective",
           line=10, span=0, status=None, error=None):
        ev = Event(rank=self.rank, index=self.index, kind=kind, op=op,
                   status=status or ("ok" if done else "in_flight"), group=group,
                   group_desc="", group_ranks=tuple(ranks), seq=seq, peer=peer,
                   shapes=((numel,),), dtypes=(dtype,), device="cpu", numel_in=numel,
                   numel_out=numel, reduce_op="sum" if "reduce" in op else None,
                   callsite={"file": "/job/train.py", "line": line, "function": "step"},
                   t_enter_ns=int(t * S), t_end_ns=int((t + wait) * S) if done else None,
                   span_index=span, name=None, error=error, is_async=False,
                   other_thread=False)
        self.index += 1
        return ev

    def span(self, name, t=0.0):
        ev = Event(rank=self.rank, index=self.index, kind="span", op="span", status="ok",
                   group="", group_desc="", group_ranks=(), seq=0, peer=None, shapes=(),
                   dtypes=(), device="", numel_in=0, numel_out=0, reduce_op=None,
                   callsite=None, t_enter_ns=int(t * S), t_end_ns=None, span_index=0,
                   name=name, error=None, is_async=None, other_thread=False)
        self.index += 1
        return ev


def engine_with(events, timeout=5.0, now=None, heartbeats=None, exits=None):
    e = Engine(timeout)
    e.ingest(events, 0.0)
    for rank, hb in (heartbeats or {}).items():
        e.heartbeat(rank, int(hb * S), 0.0)
    for rank, info in (exits or {}).items():
        e.exited(rank, info)
    e.tick(now, final=True)
    return e.findings()


def _steps(n_ranks, steps, late_rank=None, late_ms=0.0, cohort=(), first_step_ms=0.0):
    """Each step: 10 world collectives; `late_rank` arrives `late_ms` late at the first;
    a `cohort` of ranks arrives 300 ms late together at the last (as a pipeline stage);
    in the first step the others connect `first_step_ms` late (lazy connection set-up)."""
    streams = [Stream(r) for r in range(n_ranks)]
    evs, seq, t = [], 0, 0.0
    ranks = tuple(range(n_ranks))
    for step in range(steps):
        open_span = {}
        for s in streams:
            ev = s.span(f"step {step}", t)
            open_span[s.rank] = ev.index + 1  # what the tracer stamps on ops inside it
            evs.append(ev)
        for k in range(10):
            delay = {r: 0.0 for r in ranks}
            if k == 0 and late_rank is not None:
                delay[late_rank] = late_ms / 1000
                if step == 0:
                    delay = {r: first_step_ms / 1000 for r in ranks if r != late_rank}
                    delay[late_rank] = 0.0
            if k == 9:
                for r in cohort:
                    delay[r] = 0.3
            arrive_last = max(delay.values())
            for s in streams:
                enter = t + delay[s.rank] + 0.0001 * ((s.rank * 7 + k) % 5)  # jitter
                evs.append(s.op(ranks=ranks, seq=seq, t=enter,
                                wait=t + arrive_last + 0.001 - enter,
                                span=open_span[s.rank]))
            seq += 1
            t += 0.5
    return evs
