"""Rendezvous: the meeting of ranks at one collective (group, seq) or one p2p pairing.

Ranks number their ops per group (collectives) and per group, direction and peer (p2p),
so the k-th collective of a group on every rank is the same rendezvous, and a rank's k-th
send to peer P pairs with P's k-th recv from it. Everything the detectors need about a
collective is which ranks have arrived (with their events) and which are expected.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from distdoctor.runlog.reader import Event

SEND_OPS = ("send",)
RECV_OPS = ("recv",)


def key_of(ev: Event) -> tuple | None:
    """The rendezvous an op belongs to, or None when it cannot be matched."""
    if ev.kind == "collective":
        return ("c", ev.group, ev.seq)
    if ev.kind == "p2p":
        peer = ev.peer_global
        if peer is None:
            return None  # recv from any source: its sender is only known afterwards
        if ev.op in SEND_OPS:
            return ("p", ev.group, ev.rank, peer, ev.seq)
        if ev.op in RECV_OPS:
            return ("p", ev.group, peer, ev.rank, ev.seq)
    return None


@dataclass(slots=True)
class Rendezvous:
    key: tuple
    group: str
    group_desc: str
    seq: int
    members: tuple[int, ...]  # global ranks expected (a p2p pairing: sender, receiver)
    first_seen_s: float  # engine clock when the first rank arrived
    arrivals: dict[int, Event] = field(default_factory=dict)
    done: int = 0  # arrivals that have finished (kept by `arrive`)
    first_raw: tuple | None = None  # the first arrival's raw fields (a cheap equality test)
    first_sig: tuple | None = None  # and its signature (mismatch.py), once one differs
    mismatch_since_s: float | None = None  # engine clock when arrivals first disagreed
    reported: bool = False

    @classmethod
    def open(cls, key: tuple, ev: Event, now_s: float) -> Rendezvous:
        if key[0] == "p":
            members = (key[2], key[3])
        else:
            members = ev.group_ranks or ()
        return cls(key, ev.group, ev.group_desc, ev.seq, tuple(members), now_s)

    @property
    def is_p2p(self) -> bool:
        return self.key[0] == "p"

    @property
    def missing(self) -> list[int]:
        return [r for r in self.members if r not in self.arrivals]

    def arrive(self, ev: Event) -> bool:
        """Record a rank's op (new, or its completion); True if it is new here."""
        old = self.arrivals.get(ev.rank)
        self.arrivals[ev.rank] = ev
        if ev.t_end_ns is not None and (old is None or old.t_end_ns is None):
            self.done += 1
        return old is None

    @property
    def complete(self) -> bool:
        """Every member arrived and finished (counted, not scanned: groups can be large).
        Every arrival, too: a rank that is no member (a group name that stands for other
        ranks on it) must not make up for a member still in flight."""
        n = len(self.members)
        return (n > 0 and self.done >= n and self.done >= len(self.arrivals)
                and len(self.arrivals) >= n and not self.missing)

    def label(self) -> str:
        """'all_reduce #12 in group 3 (loss_reduce)' or 'send 0 -> 1 #4 in group 0'."""
        ops = sorted({e.op for e in self.arrivals.values()}) or ["?"]
        group = f"group {self.group}" + (f" ({self.group_desc})" if self.group_desc else "")
        if self.is_p2p:
            return f"p2p {self.key[2]} -> {self.key[3]} #{self.seq} in {group}"
        return f"{'/'.join(ops)} #{self.seq} in {group}"
