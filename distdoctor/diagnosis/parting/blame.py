"""Who strayed where the ranks parted: step 3 of four (align.py, branch.py, blame.py,
parted.py).

Where a majority stands at one op, the odd side strayed. Where none does (two ranks, an
even split) the trace cannot tell "rank 0 added a stray op" from "rank 1 skipped a needed
one": they look the same. The program can (branch.py):
- a branch on the rank's identity (`if rank == 0:`, `master_process`, `@rank_zero_only`)
  is code meant for some ranks only: the side that took its guarded arm (issued the
  collective under it, or took the way out under it) strayed;
- a branch on data (`if os.path.exists(p):`, `if loss.isnan(): return`, a loop over
  uneven batches, an `except`) means the ranks' data differed: the side whose data sent
  it past the collective every rank was to issue there (it did not enter the arm that
  holds it, took the way out, the handler) strayed;
- where both sides issued ops in the two arms, nothing in the program says which arm
  was meant: a tie that names the branch.
A framework's designed barrier (`main_process_first`, `wait_for_everyone`) is never the
fault itself. Where the source cannot be read or shows no branch, the job's own rhythm
and history may tell (the call the job made after the same calls before; a call site it
issued before); position in time ("further along") never decides.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from distdoctor.diagnosis.parting import align as A
from distdoctor.diagnosis.parting import branch as B
from distdoctor.diagnosis.parting import source as S
from distdoctor.runlog.reader import Event

# framework contexts whose barrier orders the ranks on purpose: the main process runs
# the block first while the others wait, then the others run it
ORDERING_CONTEXTS = ("main_process_first", "local_main_process_first", "rank_zero_first")


@dataclass
class Verdict:
    side: int | None  # 0: side a strayed; 1: side b; None: nothing tells (a tie)
    why: str  # the evidence, in words
    skipped: bool = False  # the side that strayed left out the other's op and went on
    branch: B.Branch | None = None
    unreadable: str | None = None  # the file that would have told, unreadable


class Sides:
    """A parting as the evidence reads it: side a's op (`p.ours`) against side b's
    (`p.theirs`), each side's op now (its op at the parting, else what it went on to),
    whether the job issued each before (`known`); for an op one side issued and the other
    did not, which side has it (`has`), which lacks it (`lacks`) and what that one went
    on to (`went`)."""

    def __init__(self, p: A.Parting, a: int, b: int, histories):
        self.p, self.a, self.b = p, a, b
        where = p.ours or p.theirs
        self.seq = where.seq
        self.pool = [histories.get(a, ()), histories.get(b, ())]
        self.ops = [A.before(h, where.group, self.seq) for h in self.pool]
        self.known = (A.familiar(p.ours, self.pool, self.seq),
                      A.familiar(p.theirs, self.pool, self.seq))
        extra = p.how == "extra"
        self.op = p.ours if extra else p.theirs
        self.op_known = self.known[0] if extra else self.known[1]
        self.has, self.lacks = (0, 1) if extra else (1, 0)
        self.went = p.next_theirs if extra else p.next_ours
        self.before = self.ops[0] if extra else self.ops[1]
        self.now = (p.ours or p.next_ours, p.theirs or p.next_theirs)


def _designed(ev: Event | None) -> bool:
    """The op is the barrier of a framework's ordering context (`with
    accelerator.main_process_first():`), or the framework's own `wait_for_everyone`
    reached through another of its calls; not one the user called: a `wait_for_everyone`
    the user calls under `if is_main_process:` is the user's stray barrier."""
    cs = (ev.callsite or {}) if ev is not None else {}
    call, fw = cs.get("call") or "", (cs.get("framework") or {}).get("function") or ""
    if any(name in call or name in fw for name in ORDERING_CONTEXTS):
        return True
    return "wait_for_everyone" in fw and bool(call) and "wait_for_everyone" not in call


def _designed_branch(ev: Event, inside: int) -> B.Branch | None:
    """The ordering context as the branch: the main process runs its block first and
    alone; side `inside` issued a collective in it."""
    cs = ev.callsite or {}
    src = S.read(cs.get("file"))
    if src is None or not cs.get("line"):
        return None
    node = next((n for n in ast.walk(src.tree) if isinstance(n, (ast.With, ast.AsyncWith))
                 and n.lineno == cs["line"]), None)
    text = ("with " + ", ".join(src.segment(i.context_expr) for i in node.items) + ":"
            if node is not None else src.text.splitlines()[cs["line"] - 1].split("#")[0].strip())
    did = ["ran the block of {b} first and alone (the main process)",
           "waited in the barrier of {b}, as it is meant to,"]
    return B.Branch(cs["file"], cs["line"], cs.get("function") or "?", "with", text, "rank",
                    did if inside == 0 else did[::-1],
                    [inside == 0, inside == 1], [False, False])


def _by_branch(s: Sides, br: B.Branch) -> Verdict:
    """Who strayed, from the kind of branch that split the sides (the module doc)."""
    said = f"`{br.condition}` ({br.where()})"
    ranks = (s.a, s.b)
    if br.left[0] != br.left[1]:  # one side took a way out the other did not
        side = 0 if br.left[0] else 1
        if br.kind == "rank" and br.gate:  # the rest of the function is for the others
            went = 1 - side
            return Verdict(went, f"{said} is a branch on the rank's identity that lets only "
                                 f"some ranks past line {br.exit_line}: the collective after "
                                 f"it, which rank {ranks[went]} issued, is code meant for "
                                 f"them alone", False, br)
        what = ("a branch on the rank's identity: code meant for some ranks only"
                if br.kind == "rank" else
                f"an exception handler: rank {ranks[side]} raised in its `try` and the "
                f"others did not" if br.kind == "exception" else
                f"a branch on the ranks' data: rank {ranks[side]}'s data sent it out")
        return Verdict(side, f"{said} is {what}", s.p.how == "differ", br)
    if br.inside[0] == br.inside[1]:
        return Verdict(None, f"the two sides took two arms of {said}, and nothing in the "
                             f"program says which was meant", False, br)
    inside = 0 if br.inside[0] else 1
    if br.feeds:
        return Verdict(inside, f"{said} changed what rank {ranks[inside]} sent at that line: "
                               f"it issued more collectives there than the others", False, br)
    if br.kind == "rank":
        return Verdict(inside, f"{said} is a branch on the rank's identity: code meant for "
                               f"some ranks only", False, br)
    outside = 1 - inside
    return Verdict(outside, f"{said} is a branch on the ranks' data: rank {ranks[outside]}'s "
                            f"data sent it past the collective the others issued under it",
                   s.p.how == "differ", br)


def _by_rhythm(s: Sides) -> Verdict | None:
    """The side whose op is not the call the job made after the same calls before broke
    the job's rhythm (a loop's step: the rank at the earlier line may be an iteration
    ahead)."""
    p = s.p
    ranks = (s.a, s.b)
    if p.how != "differ":
        fits, went_fits = A.fits(s.op, s.before, s.ops), A.fits(s.went, s.before, s.ops)
        has, lacks = ranks[s.has], ranks[s.lacks]
        if fits is True and went_fits is False:
            return Verdict(s.lacks, f"rank {has}'s {s.op.op} is the call the job made after "
                                    f"the same calls before; rank {lacks} skipped it")
        if fits is False and went_fits is True:
            return Verdict(s.has, f"rank {lacks} went on to the call the job made after the "
                                  f"same calls before; rank {has}'s {s.op.op} came in between")
        return None
    fa, fb = A.fits(p.ours, s.ops[0], s.ops), A.fits(p.theirs, s.ops[1], s.ops)
    if fa is fb or None in (fa, fb):
        return None
    strayed = 1 if fa else 0
    bad, good = (p.theirs, p.ours) if fa else (p.ours, p.theirs)
    skipped = A.fits(bad, [*(s.ops[0] if fa else s.ops[1]), good], s.ops) is True
    return Verdict(strayed, f"rank {ranks[1 - strayed]}'s {good.op} is the call the job made "
                            f"after the same calls before; rank {ranks[strayed]} "
                   + ("left it out and went on to the call after it" if skipped
                      else "made another"), skipped)


def _by_history(s: Sides) -> Verdict | None:
    """A call site the job has issued before is the path, a new one the detour."""
    p = s.p
    ranks = (s.a, s.b)
    if p.how != "differ":
        has, lacks = ranks[s.has], ranks[s.lacks]
        if s.op_known is True:
            return Verdict(s.lacks, f"rank {has}'s {s.op.op} is a call the job issued "
                                    f"before; rank {lacks} skipped it")
        if s.op_known is False and A.familiar(s.went, s.pool, s.seq) is True:
            return Verdict(s.has, f"rank {has}'s {s.op.op} at that line is new to the job, "
                                  f"while rank {lacks} went on to a call it issued before")
        return None
    built = _built_apart(s)
    if built is not None:
        return built
    ka, kb = s.known
    if ka is True and kb is False:
        return Verdict(1, f"rank {s.a}'s call is one the job issued before, rank {s.b}'s "
                          f"is new")
    if kb is True and ka is False:
        return Verdict(0, f"rank {s.b}'s call is one the job issued before, rank {s.a}'s "
                          f"is new")
    return None


def _kind(ev: Event) -> tuple:
    return ev.op, A.site(ev), ev.dtypes[:1], ev.reduce_op


def _built_apart(s: Sides) -> Verdict | None:
    """One line, one op, the same size, but another dtype or reduce op on one side: the
    side whose dtype and op the job sent from that line before kept to it, the other
    built its tensor (or chose its op) differently. Sizes are left out: they vary with
    the data from step to step, a dtype or an op does not."""
    p = s.p
    if (p.ours.op, A.site(p.ours), p.ours.numel_in) != (p.theirs.op, A.site(p.theirs),
                                                         p.theirs.numel_in):
        return None

    def sent_before(ev):
        return any(e.kind == "collective" and e.group == ev.group and e.seq < s.seq
                   and _kind(e) == _kind(ev) for pool in s.pool for e in pool)
    seen = (sent_before(p.ours), sent_before(p.theirs))
    if seen[0] == seen[1]:
        return None
    odd = 0 if seen[1] else 1
    bad, good = (p.ours, p.theirs) if odd == 0 else (p.theirs, p.ours)
    what = ("dtype", bad.dtypes[:1], good.dtypes[:1]) if bad.dtypes[:1] != good.dtypes[:1] \
        else ("reduce op", bad.reduce_op, good.reduce_op)
    return Verdict(odd, f"rank {(s.a, s.b)[odd]} sent {what[0]} {_one(what[1])} from that "
                        f"line where the job sent {_one(what[2])} there before: it built its "
                        f"op differently")


def _one(v) -> str:
    return str(v[0] if isinstance(v, tuple) and v else v)


def judge(p: A.Parting, a: int, b: int, histories, majority: bool) -> Verdict:
    """Which side strayed: side a (rank `a`'s, `p.ours`) or side b (rank `b`'s), why,
    and the branch that split them. With a majority, side a is the odd one out and the
    branch only shapes the words."""
    s = Sides(p, a, b, histories)
    br, unreadable = B.read(s.p.after, s.now[0], s.now[1])
    if majority:
        return Verdict(0, "", False, br, unreadable)
    designed = [_designed(ev) for ev in s.now]
    if designed[0] != designed[1]:  # one side waits in a framework's designed barrier
        inside = 1 if designed[0] else 0
        ctx = _designed_branch(s.now[1 - inside], inside) or br
        return Verdict(inside, f"rank {(s.a, s.b)[1 - inside]} waits in the barrier of the "
                               f"framework's main-process-first context, by design; the "
                               f"collective inside the block is the fault", False, ctx,
                       unreadable)
    verdict = _by_branch(s, br) if br is not None else None
    if verdict is None or verdict.side is None:
        fallback = _by_rhythm(s) or _by_history(s)
        if fallback is not None and verdict is not None:  # the branch, named; history tells
            fallback.why = f"{verdict.why}; {fallback.why}"
            fallback.branch = br
        verdict = fallback or verdict
    if verdict is None:
        why = ("nothing tells which rank strayed" if unreadable is None else
               f"nothing tells which rank strayed: the source of {unreadable} could not be "
               f"read to find the branch")
        verdict = Verdict(None, why, False, br)
    verdict.unreadable = unreadable
    return verdict
