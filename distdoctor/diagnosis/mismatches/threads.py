"""One process group used from two user threads of a rank.

Collectives are matched across ranks by their order on the group. Two threads issuing on
one group (an async-checkpoint thread, a metrics thread beside the training loop) put
their ops in whatever order the threads happen to run, which differs from rank to rank:
the job dies in a mismatch or a deadlock that no rank-dependent branch explains. The
tracer names the thread of every op issued from a user frame off the main thread
(`callsite["thread"]`, `["thread_id"]`); torch's own threads (autograd's, DDP's reducer,
FSDP's) have no user frame and take the main thread's line, so they count as the main
thread here.

`ThreadUse` watches this as ops arrive (a dictionary look-up an op): a group whose user
threads take turns on a rank is a hazard worth saying before it fails (an info finding).
`threads_on` answers the question after a failure, from the ranks' recent ops.
"""

from __future__ import annotations

from distdoctor.findings import Finding, site_text, who
from distdoctor.runlog.reader import Event

MAX_GROUPS = 4096  # (rank, group) pairs followed


def thread_of(ev: Event) -> int:
    """The op's user thread: its ident, 0 for the main thread (and torch's threads)."""
    cs = ev.callsite
    return cs.get("thread_id", 0) if cs else 0


def thread_label(ev: Event) -> str:
    cs = ev.callsite or {}
    return cs.get("thread") if cs.get("thread_id") else "the main thread"


BACKGROUND = -1  # a thread torch runs beside the main thread (no user frame of its own)
_FAILED = ("error", "timeout")  # an op's end that failed


def _background(ev: Event) -> bool:
    return bool(ev.other_thread) and not thread_of(ev)


def beside_main(history, group: str) -> bool:
    """Whether a thread with no user frame issued ops on `group` while the main thread
    was itself in a collective on it (the op took the main thread's line, and that line
    issued a collective on the group from the main thread): a thread running beside the
    main thread, such as an async checkpoint's executor. Autograd's threads issue while
    the main thread waits in backward(), a line that issues nothing itself."""
    ops = [ev for ev in history if ev.kind == "collective" and ev.group == group]
    main = {(ev.callsite or {}).get("line") for ev in ops if not ev.other_thread}
    return any(_background(ev) and (ev.callsite or {}).get("line") in main for ev in ops)


def key_of(ev: Event, beside: bool) -> int:
    return BACKGROUND if beside and _background(ev) else thread_of(ev)


def label_of(ev: Event, beside: bool) -> str:
    if key_of(ev, beside) == BACKGROUND:
        return "a thread of torch's beside the main thread"
    return thread_label(ev)


def threads_on(history, group: str, beside: bool | None = None) -> dict[int, Event]:
    """The user threads (and a torch thread running beside the main thread: `beside`,
    found in this history when None) that issued collectives on `group` in a rank's
    recent ops: thread -> its latest op there."""
    if beside is None:
        beside = beside_main(history, group)
    out: dict[int, Event] = {}
    for ev in history:
        if ev.kind == "collective" and ev.group == group:
            out[key_of(ev, beside)] = ev
    return out


def where(ev: Event, beside: bool = False) -> str:
    cs = ev.callsite or {}
    at = site_text(cs) or f"?:{cs.get('line')}"
    fw = (cs.get("framework") or {}).get("function")
    what = f"in {fw}, while the main thread was at {at}" if (
        key_of(ev, beside) == BACKGROUND and fw) else f"in {cs.get('function') or '?'} at {at}"
    return f"{label_of(ev, beside)} ({ev.op} {what})"


REMEDY = ("Issue a group's collectives from one thread only: give the background work "
          "(checkpointing, metrics, logging) a process group of its own, created with "
          "dist.new_group() on every rank in the same order, or hand its collectives to the "
          "main thread. Across threads, the order of collectives is not defined, so each "
          "rank interleaves them differently.")


class ThreadUse:
    """Per (rank, group): the user thread of the last op, and how often it changed."""

    def __init__(self):
        # (rank, group) -> [thread of the last op, turns, {thread: op at a turn}, last op]
        self._last: dict[tuple, list] = {}
        self.reported: set[str] = set()

    def op(self, ev: Event, recent) -> None:
        """A new collective `ev`; `recent`: its rank's last ops, `ev` the newest. A group
        is followed from the first op a user thread issues on it (until then every op is
        the main thread's: the common case costs a dictionary read), and starts with the
        main thread's last op before it, from `recent`."""
        tid = thread_of(ev)
        if not tid and not self._last:
            return
        key = (ev.rank, ev.group)
        st = self._last.get(key)
        if st is None:
            if not tid or len(self._last) >= MAX_GROUPS:
                return
            before = next((e for e in reversed(recent) if e is not ev
                           and e.kind == "collective" and e.group == ev.group), None)
            st = self._last[key] = [0, 0, {}, before] if before is not None else [tid, 0, {}, ev]
        if st[0] != tid:  # a turn: each thread is shown by its op at the hand-over
            seen = st[2]
            if len(seen) < 8:
                seen.setdefault(st[0], st[3])
                seen.setdefault(tid, ev)
            st[0] = tid
            st[1] += 1
        st[3] = ev

    def findings(self) -> list[Finding]:
        """An info finding per group whose user threads took turns on a rank (A, B, A)."""
        by_group: dict[str, list] = {}
        for (rank, group), (_, turns, seen, _) in self._last.items():
            if turns >= 2 and len(seen) >= 2 and group not in self.reported:
                by_group.setdefault(group, []).append((rank, seen))
        out = []
        for group, users in by_group.items():
            self.reported.add(group)
            ranks = sorted(r for r, _ in users)
            seen = users[0][1]
            who = " and ".join(where(ev) for ev in seen.values())
            first = next(iter(seen.values()))
            desc = f" ({first.group_desc})" if first.group_desc else ""
            summary = (f"group {group}{desc} is used from {len(seen)} threads of rank"
                       f"{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {who}; "
                       f"the order of collectives across threads is not defined, so ranks "
                       f"may issue them in different orders (a mismatch or a deadlock)")
            out.append(Finding("mismatch", "info", summary, [], group, None,
                               [{"rank": ranks[0], **{k: (ev.callsite or {}).get(k) for k in
                                                      ("file", "line", "function", "thread")}}
                                for ev in seen.values()],
                               details={"reason": "threads_share_group", "ranks": ranks,
                                        "threads": [
                                   thread_label(ev) for ev in seen.values()]},
                               remedy=REMEDY))
        return out


def race_at_failure(histories: dict, failed: dict[int, int | None]) -> Finding | None:
    """A job that failed while a rank had collectives of one group in flight from two
    threads at once: which of them the transport ran first is undefined, and the ranks
    ran them in different orders. The traced order can agree on every rank (each thread
    numbers its op before the transport takes it), so no traced mismatch shows it; gloo
    aborts on the size it did not expect (a 4-byte metric where 1 KiB of gradients was
    posted) or times out on the pairing it waits for (a main thread's barrier beside an
    async checkpoint's gathers), at any op, before a thread has taken turns on the group.
    The threads are told apart as `threads_on` does (a torch thread running beside the
    main thread is one). `failed`: rank -> exit code of the ranks that failed. Not said
    where a rank was killed from outside (SIGKILL: that is the cause), nor where a failed
    rank's last op went well (its own code raised between collectives)."""
    if any(code == -9 for code in failed.values()):
        return None
    beside: dict[str, bool] = {}  # group -> a torch thread seen beside the main thread

    def beside_on(g: str) -> bool:
        if g not in beside:  # (one program: seen on one rank, the same thread on all)
            beside[g] = any(beside_main(histories.get(r, ()), g) for r in failed)
        return beside[g]

    used: dict[int, dict[int, Event]] = {}
    group = None
    for rank, code in sorted(failed.items()):
        if code == -15:  # stopped by the launcher once another rank failed
            continue
        open_ops: dict[str, list[Event]] = {}
        for ev in histories.get(rank, ()):
            if ev.kind == "collective" and (ev.t_end_ns is None or ev.status in _FAILED):
                open_ops.setdefault(ev.group, []).append(ev)
        for g, evs in open_ops.items():
            by_thread = {key_of(ev, beside_on(g)): ev for ev in evs}
            if len(by_thread) > 1 and group in (None, g):
                group, used[rank] = g, by_thread
    if not used:
        return None
    for rank in failed:  # a failed rank whose last op went well failed of its own code
        last = next((ev for ev in reversed(histories.get(rank, ()))
                     if ev.kind == "collective"), None)
        if rank not in used and (last is None or (last.t_end_ns is not None
                                                  and last.status not in _FAILED)):
            return None
    ranks = sorted(used)
    seen = used[ranks[0]]
    b = beside_on(group)
    first = min(seen.values(), key=lambda ev: ev.seq)
    desc = f" ({first.group_desc})" if first.group_desc else ""
    summary = (f"group {group}{desc} is used from {len(seen)} threads of {who(ranks)}: "
               f"{' and '.join(where(ev, b) for ev in seen.values())}, in flight at once when "
               f"the job failed; the order of collectives across threads is not defined, so "
               f"the ranks ran them in different orders")
    return Finding("mismatch", "error", summary, ranks, group, first.seq,
                   [{"rank": ranks[0], **{k: (ev.callsite or {}).get(k) for k in
                                          ("file", "line", "function")},
                     "thread": label_of(ev, b)} for ev in seen.values()],
                   details={"reason": "threads_share_group", "ranks": ranks,
                            "threads_share_group": {str(r): [where(ev, b) for ev in s.values()]
                                                    for r, s in sorted(used.items())},
                            "in_flight_at_once": True},
                   remedy=REMEDY)
