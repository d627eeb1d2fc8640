"""What a DIGEST frame (collect/digest.py) may hold, checked whole as the collector takes
it in: every field of every part typed, every number bounded (peer_numbers.py), every
list within what a node sends. A frame with one field amiss is refused (WireError: the
node is dropped with one line naming the field) and nothing of it is kept, so what the
fleet engine holds (fleet.py), decodes later (position.py) and the views render
(views/fleet_view.py) is sound by construction: no exception from a peer's number can
reach the diagnosis thread, /metrics, or another node's frame.

The parts, as DigestBuilder.take writes them:
- ranks: [rank, newest op row, newest finished op row, issued per group, clock ns, exit,
  stopped, state]; an op row is digest.event_row's 16 fields; the state is
  Engine.rank_summary's (failed, span, steps, split, late_ms, hb_age_s, progress, done);
- groups: name -> [description, member ranks]; sigs: number -> an op row;
- arrivals: [group, first seq, signature, ranks, count] runs (digest.runs);
- waits: [group, seq, members finished, shortest wait ns, its rank, next shortest ns,
  [op, elements]].
"""

from __future__ import annotations

from distdoctor.collect.limits import (
    MAX_ARRIVED,
    MAX_DIGEST_GROUPS,
    MAX_ISSUED_GROUPS,
    MAX_RANK,
    MAX_RANKS,
    MAX_RANKS_PER_NODE,
)
from distdoctor.collect.peer_numbers import (
    INT64,
    MAX_SECONDS,
    digits,
    ints_within,
    is_count,
    is_int,
)
from distdoctor.collect.wire import WireError

MAX_NAME = 256  # a group's name or description, a function's name, as the collector keeps it
MAX_WAITERS = 1 << 24  # members of one collective a node says finished
# Engine.rank_summary's step breakdown (diagnosis/engine/core.SPLIT, which collect/ does
# not import: the engine is the node's)
_SPLIT = ("steps", "wall_ms", "collective_ms", "data_ms", "compute_ms")
_FLAG = (bool, int)  # a flag a node's engine may compute as either
_SEQ = (list, tuple)  # JSON's arrays, and the tuples DigestBuilder.take makes in-process
_S = MAX_SECONDS


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise WireError(f"DIGEST frame has {what}")


def _is_rank(x) -> bool:
    return type(x) is int and 0 <= x < MAX_RANK


# --- an op ------------------------------------------------------------------------------

def check_row(row) -> None:
    """An op row (digest.event_row) or None: each of its 16 fields typed, each number an
    int within 64 bits (event numbers and element counts not negative). Written out as
    a few tests and short loops, no call: it runs for the rows of every rank in every
    digest (0.9 us a row; a set of the rows' types, or helper calls, cost more)."""
    if row is None:
        return
    if type(row) not in _SEQ or len(row) != 16:
        raise WireError("DIGEST frame has a malformed op")
    (index, kind, op, status, group, seq, peer, shapes, dtypes, numel_in, numel_out,
     reduce_op, cs, t_enter, t_end, error) = row
    if not (type(index) is int and type(seq) is int and type(numel_in) is int
            and type(numel_out) is int and type(t_enter) is int
            and 0 <= index < INT64 and 0 <= numel_in < INT64 and 0 <= numel_out < INT64
            and -INT64 <= seq < INT64 and -INT64 <= t_enter < INT64
            and (t_end is None or (type(t_end) is int and -INT64 <= t_end < INT64))
            and (peer is None or (type(peer) is int and -INT64 <= peer < INT64))):
        raise WireError("DIGEST frame has an op whose numbers are out of range")
    if not (type(kind) is str and type(op) is str and type(status) is str
            and type(group) is str and (reduce_op is None or type(reduce_op) is str)
            and (error is None or type(error) is str) and type(dtypes) in _SEQ
            and type(shapes) in _SEQ
            and (cs is None or (type(cs) in _SEQ and len(cs) == 3
                                and (cs[0] is None or type(cs[0]) is str)
                                and (cs[1] is None or (type(cs[1]) is int
                                                       and -INT64 <= cs[1] < INT64))
                                and (cs[2] is None or type(cs[2]) is str)))):
        raise WireError("DIGEST frame has an op with a malformed text field or call site")
    for d in dtypes:
        if type(d) is not str:
            raise WireError("DIGEST frame has an op with a malformed dtype")
    for s in shapes:
        if type(s) not in _SEQ:
            raise WireError("DIGEST frame has an op with a malformed shape")
        for d in s:
            if type(d) is not int or not -INT64 <= d < INT64:
                raise WireError("DIGEST frame has an op with a malformed shape")


# --- a rank's position and state --------------------------------------------------------

def position_of(item) -> tuple:
    """(rank, newest op row, newest finished row, issued, clock ns, exit, stopped, state)
    of one entry of a digest's ranks, checked; its state as rank_state makes it."""
    _need(type(item) in _SEQ and 7 <= len(item) <= 8, "a malformed rank position")
    rank, latest, last_done, issued, now_ns, exit_, stopped = item[:7]
    _need(type(rank) is int and 0 <= rank < MAX_RANK and type(issued) is dict
          and len(issued) <= MAX_ISSUED_GROUPS and ints_within(issued.values(), 0, INT64)
          and (now_ns is None or (type(now_ns) is int and -INT64 <= now_ns < INT64))
          and (exit_ is None or type(exit_) is str) and type(stopped) is bool,
          "a malformed rank position")
    check_row(latest)
    if last_done != latest:  # (most often its newest op is its newest finished one)
        check_row(last_done)
    state = rank_state(item[7] if len(item) == 8 else {})
    if any(len(g) > MAX_NAME for g in issued):
        issued = {g[:MAX_NAME]: n for g, n in issued.items()}
    return (rank, latest, last_done, issued, now_ns,
            None if exit_ is None else exit_[:500], stopped, state)


def _seconds(x) -> bool:
    """None, or an int or float within +-MAX_SECONDS (NaN and the infinities are not)."""
    return x is None or ((type(x) is float or type(x) is int) and -_S <= x <= _S)


def rank_state(state) -> dict:
    """A rank's state beyond its position (Engine.rank_summary), each field it has
    checked (seconds and milliseconds finite, within +-MAX_SECONDS: a heartbeat's age
    may be a little below zero, two clocks read); the same dict, a long span cut.
    Written out, as check_row: it runs for every rank in every digest."""
    if type(state) is not dict:
        raise WireError("DIGEST frame has a malformed rank state")
    get = state.get
    steps, split, progress, done = get("steps"), get("split"), get("progress"), get("done")
    span = get("span")
    if not (type(get("failed", False)) is bool and (span is None or type(span) is str)
            and (steps is None or (type(steps) is int and 0 <= steps < INT64))
            and _seconds(get("late_ms")) and _seconds(get("hb_age_s"))
            and (split is None or type(split) is dict)
            and (progress is None or (type(progress) in _SEQ and len(progress) == 6))
            and (done is None or type(done) in _SEQ)):
        raise WireError("DIGEST frame has a rank state out of range")
    if split is not None:
        for k in _SPLIT:
            v = split.get(k)
            if not (type(v) is float or type(v) is int) or not -_S <= v <= _S:
                raise WireError("DIGEST frame has a rank state whose step split is out of "
                                "range")
    if progress is not None:
        busy, idle_s, io_s, evidence, fixed_s, in_data = progress
        if not (type(busy) in _FLAG and idle_s is not None and _seconds(idle_s)
                and _seconds(io_s) and type(evidence) is str and _seconds(fixed_s)
                and type(in_data) in _FLAG):
            raise WireError("DIGEST frame has a rank progress out of range")
    for d in done or ():  # [group, description, op, count, seconds] per kind of op
        if not (type(d) in _SEQ and len(d) == 5 and type(d[0]) is str
                and type(d[1]) is str and type(d[2]) is str and type(d[3]) is int
                and 0 <= d[3] < INT64 and d[4] is not None and _seconds(d[4])):
            raise WireError("DIGEST frame has a rank's completed ops out of range")
    if span is not None and len(span) > MAX_NAME:
        state["span"] = span[:MAX_NAME]
    return state


def digest_ranks(digest: dict) -> list[int]:
    """The ranks a DIGEST frame positions (checked: at most a node's worth, each a rank
    number), which its node then owns (mirror.Mirror.claim)."""
    items = digest.get("ranks")
    if not isinstance(items, list):
        raise WireError("DIGEST frame lacks host, groups, sigs, ranks or arrivals")
    if len(items) > MAX_RANKS_PER_NODE:
        raise WireError(f"DIGEST frame of {len(items):,} ranks (a node has at most "
                        f"{MAX_RANKS_PER_NODE:,})")
    ranks = []
    for item in items:
        _need(type(item) in _SEQ and item and _is_rank(item[0]), "a malformed rank position")
        ranks.append(item[0])
    return ranks


# --- groups, signatures, arrivals, waits ------------------------------------------------

def groups_of(groups: dict) -> dict[str, tuple[str, tuple[int, ...]]]:
    """A digest's groups, checked: at most MAX_DIGEST_GROUPS, names bounded, members a
    list of ranks no longer than a copy holds."""
    if len(groups) > MAX_DIGEST_GROUPS:
        raise WireError(f"DIGEST frame names {len(groups):,} groups (at most "
                        f"{MAX_DIGEST_GROUPS:,})")
    out = {}
    for name, value in groups.items():
        _need(type(value) in _SEQ and len(value) == 2 and type(value[1]) in _SEQ
              and len(value[1]) <= MAX_RANKS and len(name) <= MAX_NAME
              and ints_within(value[1], 0, MAX_RANK), "a malformed group")
        out[name] = (str(value[0])[:MAX_NAME], tuple(value[1]))
    return out


def sig_numbers(sigs: dict) -> dict[int, list]:
    """A digest's new signatures: the node's number -> an op row (checked when decoded,
    digest.row_event); a number that is no decimal of 18 digits at most is left out."""
    return {int(n): row for n, row in sigs.items() if digits(n)}


def arrivals_of(arrivals: list, host: str, members_of: dict | None) -> list[tuple]:
    """A digest's arrivals as (group, first seq, signature, ranks, count): of the node's
    own ranks (where owners are known), and at most MAX_ARRIVED rank-arrivals (a run's
    count times its ranks) in all. A run costs the fleet engine its count times its
    ranks, or its count alone when it names none: counted so (a run of no ranks counted
    as 0, or a negative count that hides others under the bound, made a 400-byte frame
    hold the collector's loop for minutes)."""
    total, out = 0, []
    for item in arrivals:
        _need(type(item) in _SEQ and len(item) == 5, "a malformed arrival")
        group, seq, sig, rs, count = item
        _need(type(group) is str and is_int(seq) and is_count(sig) and type(rs) in _SEQ
              and ints_within(rs, 0, MAX_RANK) and is_int(count), "a malformed arrival")
        _need(count >= 1 and bool(rs), "an arrival of no ranks or no collective")
        total += count * len(rs)
        if members_of is not None and any(members_of.get(r) != host for r in rs):
            raise WireError(f"DIGEST frame reports arrivals of ranks not of node {host}")
        if total > MAX_ARRIVED:
            raise WireError(f"DIGEST frame reports more than {MAX_ARRIVED:,} arrivals")
        out.append((group, seq, sig, rs, count))
    return out


def waits_of(items) -> list[tuple]:
    """A digest's waits (DigestBuilder._take_waits) as (group, seq, members finished,
    shortest wait ns, its rank, next shortest ns, (op, elements) or None); a node of the
    previous version sends no 7th item. Waits are measured on one rank's own clock: not
    negative. Written out: a node sends one per cross-node collective."""
    _need(type(items) in _SEQ, "malformed waits")
    out = []
    append = out.append
    for item in items:
        if type(item) not in _SEQ:
            raise WireError("DIGEST frame has a malformed wait")
        if len(item) == 7:
            group, seq, n, low, rank, second, what = item
            if not (type(what) in _SEQ and len(what) == 2 and type(what[0]) is str
                    and type(what[1]) is int and 0 <= what[1] < INT64):
                raise WireError("DIGEST frame has a wait out of range")
            what = (what[0][:64], what[1])
        elif len(item) == 6:
            group, seq, n, low, rank, second = item
            what = None
        else:
            raise WireError("DIGEST frame has a malformed wait")
        if not (type(group) is str and type(seq) is int and type(n) is int
                and type(low) is int and type(rank) is int
                and -INT64 <= seq < INT64 and 0 < n <= MAX_WAITERS and 0 <= low < INT64
                and 0 <= rank < MAX_RANK
                and (second is None or (type(second) is int and 0 <= second < INT64))):
            raise WireError("DIGEST frame has a wait out of range")
        append((group, seq, n, low, rank, second, what))
    return out
