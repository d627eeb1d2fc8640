"""A collector-wide cap (limits.py, fleet.py) shared by the nodes: who holds how much of it.

A cap summed over all nodes (groups, their members, findings' bytes) refused every node
that came once it was full: one peer that filled it (a hog, a bug, a host name cycled)
kept every real node out after it. So each node's holding is counted, and when a node's
new share does not fit, the nodes that hold the most go first, each only where it holds
more than the newcomer would: the hog goes (its holding freed, its connection dropped with
one line naming it), a real node's smaller share comes in, and the total never passes
the cap. A node that holds the most itself is refused, as before.
"""

from __future__ import annotations

from itertools import islice

from distdoctor.collect.wire import WireError
from distdoctor.diagnosis.mismatches.mismatch import signature


def who_goes(held: dict[str, int], host: str, more: int, cap: int, what: str,
             grows: int | None = None) -> list[str]:
    """The nodes (hosts) whose holdings make room for `host` to hold `more` beyond its own
    (`held`: host -> what it holds; `what`: the cap's unit in words; `grows`: what the
    total grows by, where not `more`: what `host` takes over from others is in it
    already); [] when it fits. WireError naming `host` when only nodes that hold no more
    than it would could go."""
    total = sum(held.values())
    over = total + (more if grows is None else grows) - cap
    if over <= 0:
        return []
    mine = held.get(host, 0) + more
    out = []
    # the biggest holders first: at most a few go, however many nodes hold a little
    for other, n in sorted(held.items(), key=lambda item: -item[1]):
        if over <= 0 or n <= mine:
            break
        if other != host and not other.startswith("("):  # "(...)": the collector's own
            out.append(other)
            over -= n
    if over > 0:
        raise WireError(f"the collector holds {total:,} {what} already (at most {cap:,}), "
                        f"and no node that holds more than node {host} would ({mine:,})")
    return out


def gone_line(n: int, cap: int, what: str, host: str) -> str:
    """Why a node was let go to make room (said once, as its connection is dropped)."""
    return (f"it held {n:,} of the collector's {cap:,} {what}, the most of any node: "
            f"let go to make room for node {host}")


def node_room(serving, link, host: str) -> bool:
    """Where the nodes' connections are full (serving.MAX_NODES): one goes for `link`'s,
    the least recently heard of the address that holds the most, where that address holds
    more than the newcomer's would (a peer that opened them all keeps no node out). Said
    in one line; False when none may go."""
    by: dict[str, list] = {}
    for other in serving.nodes:
        if other.state == "node":
            by.setdefault(other.address, []).append(other)
    top = max(by.values(), key=len, default=[])
    if len(top) <= len(by.get(link.address, ())) + 1:
        return False
    quiet = min(top, key=lambda other: other.node.last_frame_s)
    why = (f"its address held {len(top)} of the collector's {len(serving.nodes)} node "
           f"connections, the most: let go to make room for node {host} from {link.address}")
    serving.drop(quiet, f"dropped {quiet.who}: {why}", "dropped", why)
    return True


MAX_GROUPS = 1 << 17  # group names over all nodes
MAX_GROUP_MEMBERS = 1 << 23  # their members, summed: ~300 MiB at most


class GroupShares:
    """The fleet engine's groups (name -> (description, members)) and their sizes, each
    group charged to the node that named it last: a node that names a group another
    named takes it over (every node names its groups again on each connection)."""

    def __init__(self):
        self.groups: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.sizes: dict[str, int] = {}  # group -> members
        self.evicted: dict[str, str] = {}  # host let go to make room -> why (the server's)
        self._charged: dict[str, str] = {}  # group -> host
        self._held_groups: dict[str, int] = {}  # host -> groups charged to it
        self._held_members: dict[str, int] = {}  # host -> their members

    def take(self, host: str, new: dict) -> None:
        """A digest's groups (checked: digest_fields.groups_of), charged to `host`,
        within MAX_GROUPS and MAX_GROUP_MEMBERS: where they do not fit, the nodes that
        hold more go, else WireError (and nothing of them is kept)."""
        if not new:
            return
        charged, sizes = self._charged, self.sizes
        taken = {g for g in new if charged.get(g) != host}  # new here, or another's
        more_groups = len(taken)
        more_members = sum(len(m) - (0 if g in taken else sizes[g]) for g, (_, m) in new.items())
        went = {other: (n, MAX_GROUPS, "groups") for other, n in (
            (o, self._held_groups[o]) for o in who_goes(
                self._held_groups, host, more_groups, MAX_GROUPS, "groups",
                sum(g not in sizes for g in new)))}
        went.update((other, (self._held_members[other], MAX_GROUP_MEMBERS, "group members"))
                    for other in who_goes(self._held_members, host, more_members,
                                          MAX_GROUP_MEMBERS, "group members",
                                          sum(len(m) - sizes.get(g, 0)
                                              for g, (_, m) in new.items())))
        for other, (n, cap, what) in went.items():
            self._let_go(other, gone_line(n, cap, what, host))
        for g in taken:
            was = charged.get(g)
            if was is not None and was in self._held_groups:
                self._held_groups[was] -= 1
                self._held_members[was] -= sizes[g]
            charged[g] = host
        self._held_groups[host] = self._held_groups.get(host, 0) + more_groups
        self._held_members[host] = self._held_members.get(host, 0) + more_members
        self.groups.update(new)
        sizes.update((g, len(m)) for g, (_, m) in new.items())

    def _let_go(self, host: str, why: str) -> None:
        """`host`'s groups forgotten (a rank's position that names one decodes it as a
        group of unknown members); the server drops its connection, saying `why`."""
        self._held_groups.pop(host, None)
        self._held_members.pop(host, None)
        self.evicted[host] = why
        for g in [g for g, h in self._charged.items() if h == host]:
            del self._charged[g], self.groups[g], self.sizes[g]


MAX_SIGNATURES = 1 << 19  # the nodes' signatures held, summed (distinct ones: fewer)
MAX_SIGS_PER_NODE = 1 << 17  # (a node's table starts over at digest.MAX_SIGS)
MAX_OPEN = 200_000  # collectives open across nodes
OPEN_BATCH = MAX_OPEN // 16  # a node's own oldest that go at once where it holds the most


class SigShares:
    """The nodes' signature numbers, each node's counted against MAX_SIGNATURES, and the
    collector's own numbers of the distinct signatures (mismatch.signature): equal ones
    from different nodes are one number, forgotten once no node holds it. Numbers are
    never reused (an open collective may still name a forgotten one)."""

    def __init__(self, evicted: dict[str, str]):
        self.of: dict[str, dict[int, int]] = {}  # host -> its number -> ours
        self.numbers: dict[tuple, int] = {}  # signature -> ours
        self.events: dict[int, object] = {}  # ours -> an Event with that signature
        self.evicted = evicted
        self.total = 0
        self._refs: dict[int, int] = {}  # ours -> the nodes' numbers that map to it
        self._next = 0

    def room(self, host: str, numbers) -> None:
        """Room for `host`'s new `numbers`: the nodes that hold more go, else WireError."""
        mine = self.of.get(host, {})
        more = sum(int(n) not in mine for n in numbers)
        if self.total + more <= MAX_SIGNATURES:
            return
        held = {h: len(m) for h, m in self.of.items()}
        for other in who_goes(held, host, more, MAX_SIGNATURES, "signatures"):
            self.let_go(other, gone_line(held[other], MAX_SIGNATURES, "signatures", host))

    def add(self, host: str, new: dict) -> None:
        """`new`: the node's number -> an Event of it (room() made room for them)."""
        mine = self.of.setdefault(host, {})
        for n, ev in new.items():
            sig = signature(ev)
            ours = self.numbers.get(sig)
            if ours is None:
                ours = self.numbers[sig] = self._next
                self._next += 1
                self.events[ours], self._refs[ours] = ev, 0
            was = mine.get(n)
            if was == ours:
                continue  # sent again (a new connection)
            if was is not None:
                self._unref(was)
            else:
                self.total += 1
            mine[n] = ours
            self._refs[ours] += 1
        if len(mine) > MAX_SIGS_PER_NODE:  # the node's table started over long ago
            for n in list(islice(mine, len(mine) - MAX_SIGS_PER_NODE)):
                self._unref(mine.pop(n))
                self.total -= 1

    def let_go(self, host: str, why: str) -> None:
        for ours in self.of.pop(host, {}).values():
            self._unref(ours)
            self.total -= 1
        self.evicted[host] = why

    def _unref(self, ours: int) -> None:
        left = self._refs[ours] = self._refs[ours] - 1
        if not left:
            del self._refs[ours]
            self.numbers.pop(signature(self.events.pop(ours)), None)


def open_room(opened: dict, host: str, evicted: dict[str, str]) -> None:
    """The open collectives (key -> an entry naming the `host` that opened it) are full:
    the nodes that hold more than `host` would go (their entries with them, one line
    each); where none does, `host`'s own oldest go (ones a member never came to),
    OPEN_BATCH at once. The holdings are counted here, only when full: nothing is added
    to each collective's way through (the collector's hot path)."""
    held: dict[str, int] = {}
    for entry in opened.values():
        held[entry.host] = held.get(entry.host, 0) + 1
    try:
        gone = set(who_goes(held, host, 1, MAX_OPEN, "open collectives"))
    except WireError:
        gone = set()
    for other in gone:
        evicted[other] = gone_line(held[other], MAX_OPEN, "open collectives", host)
    if gone:
        for key in [k for k, e in opened.items() if e.host in gone]:
            del opened[key]
        return
    own = list(islice((k for k, e in opened.items() if e.host == host), OPEN_BATCH))
    for key in own or [next(iter(opened))]:
        del opened[key]
