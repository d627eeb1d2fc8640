"""A node's digest of its ranks, for a collector of thousands (`run --forward-digest`).

Following every event of every rank on one collector stops at a few thousand
collectives a second per core (4,096 ranks: ~60,000 a CPU second, README). With a digest
the node's own `run`, which follows its ranks anyway, sends instead, twice a second:

- each rank's position: its newest op and newest finished op (as compact events), how
  many collectives it issued per group, its clock now, and its exit if it has one: what
  the hang detector reads (diagnosis/hangs/hang.py's RankView), so the collector finds hangs
  and deadlocks across nodes with the same code as a single node;
- each collective its ranks entered, once per (group, seq, signature) with the local
  ranks that entered it, consecutive ones alike in one run: the collector compares the
  nodes' signatures of one collective, which finds a mismatch between ranks on different
  nodes;
- each rank's state beyond its position (exit, span, steps and where their time goes,
  ops completed per group and op): the collector's dashboard rows and /metrics;
- for a group with members on other nodes, once all its local members finished one of
  its collectives: how many did, the shortest wait among them, whose it was, the next
  shortest, and what it was (op, elements) (waits are clock-independent: each is
  measured on its rank's own clock). The rank with the shortest wait over all nodes
  arrived last, by the gap to the next one; the node whose shortest wait is shortest
  kept the others waiting, by the gap to the next node's (collect/lateness.py); the
  shortest wait over all nodes is the collective's own time, which a slow link between
  the nodes stretches for everyone (collect/links.py). A group wholly on the node needs none of this:
  the node's own engine completes its collectives and finds its stragglers.

A digest is one JSON object (the DIGEST frame). Groups (name, description, global ranks)
and signatures are sent once per connection and referred to by number after that. The
node keeps its full logs: post-mortem `diagnose` on a node's run dir stays exact.
"""

from __future__ import annotations

from distdoctor.collect.digest_fields import MAX_NAME, check_row
from distdoctor.collect.wire import WireError
from distdoctor.runlog.reader import Event

MAX_ARRIVALS = 200_000  # (group, seq, signature) entries held between two digests
MAX_SIGS = 1 << 16  # signatures numbered per connection; past this the table starts over
MAX_WAITS = 100_000  # (group, seq) still awaiting local members' completions
MAX_TENSORS, MAX_DIMS = 8, 16  # an op's tensors and their dimensions, as the collector keeps


def event_row(ev: Event) -> list:
    """The fields of an op the collector's detectors read, as a JSON list."""
    cs = ev.callsite
    return [ev.index, ev.kind, ev.op, ev.status, ev.group, ev.seq, ev.peer,
            [list(s) for s in ev.shapes[:4]], list(ev.dtypes[:4]), ev.numel_in,
            ev.numel_out, ev.reduce_op,
            [cs.get("file"), cs.get("line"), cs.get("function")] if cs else None,
            ev.t_enter_ns, ev.t_end_ns, ev.error]


def row_event(rank: int, row, groups: dict) -> Event:
    """An Event back from `event_row`'s list (WireError when it is not one: every field
    typed and bounded, digest_fields.check_row)."""
    check_row(row)
    (index, kind, op, status, group, seq, peer, shapes, dtypes, numel_in, numel_out,
     reduce_op, cs, t_enter, t_end, error) = row
    desc, members = groups.get(group, ("", ()))
    return Event(
        rank=rank, index=index, kind=kind[:32], op=op[:64], status=status[:32],
        group=group[:MAX_NAME], group_desc=desc, group_ranks=members, seq=seq, peer=peer,
        shapes=tuple(tuple(s[:MAX_DIMS]) for s in shapes[:MAX_TENSORS]),
        dtypes=tuple(d[:32] for d in dtypes[:MAX_TENSORS]), device="",
        numel_in=numel_in, numel_out=numel_out,
        reduce_op=None if reduce_op is None else reduce_op[:32],
        callsite=(None if cs is None else
                  {"file": str(cs[0])[:4096], "line": cs[1], "function": str(cs[2])[:MAX_NAME]}),
        t_enter_ns=t_enter, t_end_ns=t_end, span_index=0, name=None,
        error=None if error is None else error[:2000], is_async=None, other_thread=False)


def _raw_signature(ev: Event) -> tuple:
    """What two ranks' entries of one collective compare (mismatch.py's fields)."""
    return (ev.op, ev.numel_in, ev.numel_out, tuple(ev.dtypes), ev.reduce_op, ev.peer,
            tuple(tuple(s) for s in ev.shapes[:4]))


def runs(arrivals: dict) -> list[list]:
    """Arrivals as runs: [group, first seq, signature, ranks, count] stands for `count`
    consecutive collectives of the group that the same ranks entered with the same
    signature (a steady job's whole half second of one group is one run)."""
    out: list[list] = []
    by_group: dict[str, list] = {}
    for (g, seq, sig), ranks in sorted(arrivals.items(), key=_run_order):
        ranks = sorted(ranks)
        last = by_group.get(g)
        if (last is not None and last[2] == sig and last[3] == ranks
                and last[1] + last[4] == seq):
            last[4] += 1
            continue
        by_group[g] = item = [g, seq, sig, ranks, 1]
        out.append(item)
    return out


def _run_order(item) -> tuple:
    (g, seq, sig), _ = item
    return g, seq, sig


class DigestBuilder:
    """Fed each batch of events the node's live engine ingests; `take` makes a digest."""

    def __init__(self):
        self._seen: dict[int, int] = {}  # rank -> the newest event number fed
        self._arrivals: dict[tuple, list[int]] = {}  # (group, seq, sig number) -> ranks
        self._sigs: dict[tuple, int] = {}  # raw signature -> number
        self._sig_rows: dict[int, list] = {}  # number -> an event of that signature
        self._groups: dict[str, tuple] = {}
        self._sent_groups: set[str] = set()
        self._sent_sigs: set[int] = set()
        self._sig_base = 0  # numbers go on rising when the table starts over
        self._done_seen: dict[int, int] = {}  # rank -> the newest finished event fed
        # (group, seq) -> [local members finished, shortest wait, its rank, next shortest,
        # [op, elements]]
        self._waits: dict[tuple, list] = {}
        self._local: dict[str, int] = {}  # group -> its members on this node (or 0: all)
        self.dropped = 0

    def _new_sig_table(self) -> None:
        """Shapes that keep changing (variable sequence lengths) would number signatures
        without end: the table starts over, with numbers the collector has not seen."""
        self._sig_base += len(self._sigs)
        self._sigs.clear()
        self._sig_rows.clear()
        self._sent_sigs.clear()

    def reset(self) -> None:
        """A new connection: the collector knows no group or signature of ours."""
        self._sent_groups.clear()
        self._sent_sigs.clear()

    def feed(self, events) -> None:
        seen, arrivals = self._seen, self._arrivals
        for ev in events:
            if ev.kind != "collective":
                continue
            if ev.t_end_ns is not None and ev.status == "ok":
                self._finished(ev)
            if ev.index <= seen.get(ev.rank, -1):
                continue  # only each op's first sighting (in flight or done)
            seen[ev.rank] = ev.index
            self._know_group(ev)
            raw = _raw_signature(ev)
            sig = self._sigs.get(raw)
            if sig is None:
                if len(self._sigs) >= MAX_SIGS and not self._arrivals:
                    self._new_sig_table()
                sig = self._sigs[raw] = len(self._sigs) + self._sig_base
                self._sig_rows[sig] = event_row(ev)
            ranks = arrivals.get((ev.group, ev.seq, sig))
            if ranks is None:
                if len(arrivals) >= MAX_ARRIVALS:  # no digest taken for long (a collector
                    del arrivals[next(iter(arrivals))]  # slow or away): the oldest goes,
                    self.dropped += 1  # the newest ops are the ones a live view needs
                ranks = arrivals[(ev.group, ev.seq, sig)] = []
            ranks.append(ev.rank)

    def _know_group(self, ev: Event) -> None:
        if ev.group not in self._groups:
            self._groups[ev.group] = (ev.group_desc, list(ev.group_ranks))

    def _finished(self, ev: Event) -> None:
        """A local member's wait in a collective of a group that spans nodes."""
        if ev.index <= self._done_seen.get(ev.rank, -1) or self._local.get(ev.group) == 0:
            return
        self._done_seen[ev.rank] = ev.index
        key = (ev.group, ev.seq)
        wait = ev.t_end_ns - ev.t_enter_ns
        entry = self._waits.get(key)
        if entry is None:
            if len(self._waits) >= MAX_WAITS:
                del self._waits[next(iter(self._waits))]  # the oldest: a member never came
            self._waits[key] = [1, wait, ev.rank, None, [ev.op, ev.numel_in]]
            return
        entry[0] += 1
        if wait < entry[1]:
            entry[3], entry[1], entry[2] = entry[1], wait, ev.rank
        elif entry[3] is None or wait < entry[3]:
            entry[3] = wait

    def _local_members(self, engine) -> None:
        """Per group, how many of its members run on this node; 0 when all do (its
        collectives are the node's own to judge, and send no waits)."""
        here = engine.ranks
        for g, (_, members) in self._groups.items():
            if g not in self._local and members and all(r in here for r in members):
                self._local[g] = 0
            elif members:
                self._local[g] = sum(r in here for r in members)

    def _take_waits(self) -> list[list]:
        """[group, seq, members finished, shortest wait ns, its rank, next shortest,
        [op, elements]] of each collective all this node's members finished since the
        last digest."""
        out = []
        for key in [k for k, e in self._waits.items()
                    if e[0] >= self._local.get(k[0], 1 << 30)]:
            n, low, rank, second, what = self._waits.pop(key)
            out.append([key[0], key[1], n, low, rank, second, what])
        return out

    def take(self, engine, now_s: float, host: str) -> dict:
        """The digest: every rank's position (the engine's RankViews, as the hang
        detector reads them) and state, the arrivals and waits since the last digest."""
        ranks = []
        for v in engine.views(now_s).values():
            ranks.append([v.rank, event_row(v.latest) if v.latest else None,
                          event_row(v.last_done) if v.last_done else None,
                          v.issued, v.now_ns, v.exit, v.stopped,
                          engine.rank_summary(v.rank, now_s)])
            for ev in (v.latest, v.last_done):
                if ev is not None:
                    self._know_group(ev)
        self._local_members(engine)
        arrivals = runs(self._arrivals)
        self._arrivals = {}
        sigs = {str(a[2]): self._sig_rows[a[2]] for a in arrivals
                if a[2] not in self._sent_sigs}
        self._sent_sigs.update(int(s) for s in sigs)
        groups = {g: v for g, v in self._groups.items() if g not in self._sent_groups}
        self._sent_groups.update(groups)
        return {"host": host, "ranks": ranks, "groups": groups, "sigs": sigs,
                "arrivals": arrivals, "waits": self._take_waits(), "dropped": self.dropped}


class HeldDigests:
    """The bytes of a node's digest frames its ranks' positions still come from: each
    rank's position is kept from the newest frame that had it, and a frame counts while
    any rank's does. Past MAX_HELD_DIGEST_BYTES the node is refused."""

    def __init__(self):
        self.frame_of: dict[int, int] = {}  # rank -> the frame its position came from
        self.frames: dict[int, list[int]] = {}  # frame -> [bytes, ranks from it]
        self.held = 0
        self._next = 0

    def check(self, ranks: list[int], size: int) -> None:
        from distdoctor.collect.limits import MAX_HELD_DIGEST_BYTES

        freed = 0
        counts: dict[int, int] = {}
        for r in ranks:
            f = self.frame_of.get(r)
            if f is not None:
                counts[f] = counts.get(f, 0) + 1
        for f, n in counts.items():
            if self.frames[f][1] <= n:
                freed += self.frames[f][0]
        if self.held - freed + size > MAX_HELD_DIGEST_BYTES:
            raise WireError(f"DIGEST frames of this node would hold more than "
                                 f"{MAX_HELD_DIGEST_BYTES >> 20} MiB of positions")

    def hold(self, ranks: list[int], size: int) -> None:
        if not ranks:
            return
        frame = self._next = self._next + 1
        self.frames[frame] = [size, 0]
        self.held += size
        for r in ranks:
            old = self.frame_of.get(r)
            if old is not None:
                entry = self.frames[old]
                entry[1] -= 1
                if entry[1] <= 0:
                    self.held -= entry[0]
                    del self.frames[old]
            self.frame_of[r] = frame
            self.frames[frame][1] += 1
