"""mismatch: ranks that meet at the same collective (or p2p pairing) but disagree on it.

At one (group, seq) every rank must issue the same op, on the same number of elements and
dtype, with the same reduce op and root. What "the same number of elements" means depends
on the op: all-to-all may be uneven, a gather's root receives what the others send. The
culprits are the odd ones out: the ranks outside the largest variant (all of them for a tie).
"""

from __future__ import annotations

from collections import defaultdict

from distdoctor.diagnosis.rendezvous import Rendezvous
from distdoctor.findings import Finding, callsite_of, site_phrase
from distdoctor.runlog.reader import Event

# op -> which sizes must agree across ranks ("in", "out", or none)
_SIZES = {
    "all_reduce": ("in",), "all_reduce_coalesced": ("in",), "broadcast": ("in",),
    "reduce": ("in",), "all_gather": ("in", "out"), "all_gather_coalesced": ("in", "out"),
    "all_gather_into_tensor": ("in", "out"), "all_gather_into_tensor_coalesced": ("in", "out"),
    "reduce_scatter": ("in", "out"), "reduce_scatter_tensor": ("in", "out"),
    "reduce_scatter_tensor_coalesced": ("in", "out"), "gather": ("in",), "scatter": ("out",),
    "all_to_all": (), "all_to_all_single": (), "barrier": (), "monitored_barrier": (),
}
_ROOTED = ("broadcast", "reduce", "gather", "scatter")
_REDUCING = ("all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter",
             "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced")


def signature(ev: Event) -> tuple:
    """What must be equal on every rank of a collective, as (field, value) pairs."""
    sizes = _SIZES.get(ev.op, ("in",))
    sig = [("op", ev.op)]
    if "in" in sizes:
        sig.append(("numel", ev.numel_in))
    if "out" in sizes:
        sig.append(("numel_out", ev.numel_out))
    if ev.op not in ("barrier", "monitored_barrier"):
        sig.append(("dtype", ev.dtypes[0] if ev.dtypes else None))
    if ev.op in _REDUCING:
        sig.append(("reduce_op", ev.reduce_op))
    if ev.op in _ROOTED:
        sig.append(("root", ev.peer_global))
    return tuple(sig)


def p2p_signature(ev: Event) -> tuple:
    return (("numel", ev.numel_in or ev.numel_out), ("dtype", ev.dtypes[0] if ev.dtypes else None))


def _sig(rv: Rendezvous, ev: Event) -> tuple:
    return p2p_signature(ev) if rv.is_p2p else signature(ev)


def disagrees(rv: Rendezvous) -> bool:
    sigs = {_sig(rv, e) for e in rv.arrivals.values()}
    return len(sigs) > 1


def _describe(sig: tuple, shapes) -> str:
    parts = dict(sig)
    text = parts.get("op", "")
    if shapes:
        text += " " + "+".join("x".join(map(str, s)) or "scalar" for s in shapes[:3])
        if len(shapes) > 3:
            text += f"+{len(shapes) - 3} more"
    elif "numel" in parts:
        text += f" numel={parts['numel']}"
    for k in ("dtype", "reduce_op"):
        if parts.get(k):
            text += f" {parts[k]}"
    if parts.get("root") is not None:
        text += f" root={parts['root']}"
    return text.strip()


def habit(ev: Event) -> tuple:
    """What a call usually looks like on a group: op and line. A rank that departs from
    the group's habits is the likelier culprit when a vote ties (two ranks, two variants)."""
    cs = ev.callsite or {}
    return (ev.op, cs.get("file"), cs.get("line"))


def mismatch_finding(rv: Rendezvous, span_name=None,
                     familiar: set | frozenset = frozenset()) -> Finding | None:
    """The finding for a rendezvous whose arrivals disagree, else None.

    `familiar`: `habit()`s seen on this group in collectives where every rank agreed.
    """
    variants: dict[tuple, list[int]] = defaultdict(list)
    for rank, ev in sorted(rv.arrivals.items()):
        variants[_sig(rv, ev)].append(rank)
    if len(variants) < 2:
        return None
    def is_familiar(ranks):
        return all(habit(rv.arrivals[r]) in familiar for r in ranks)

    # largest variant first; in a tie, the one that looks like the group's past calls
    ordered = sorted(variants.items(),
                     key=lambda kv: (-len(kv[1]), not is_familiar(kv[1]), kv[1]))
    top = len(ordered[0][1])
    tied = [ranks for _, ranks in ordered if len(ranks) == top]
    tie = len(tied) > 1 and sum(is_familiar(r) for r in tied) != 1
    culprits = sorted(r for sig, ranks in ordered for r in ranks
                      if tie or ranks is not ordered[0][1])
    fields = sorted({k for sig in variants for k, v in sig if any(
        dict(s).get(k) != v for s in variants)})
    what = " and ".join(f.replace("numel_out", "output size").replace("numel", "size")
                        .replace("reduce_op", "reduce op") for f in fields) or "arguments"
    vlist = []
    for sig, ranks in ordered:
        first = rv.arrivals[ranks[0]]
        vlist.append({"ranks": ranks, "op": first.op, "numel": first.numel_in,
                      "numel_out": first.numel_out, "shapes": [list(s) for s in first.shapes],
                      "dtype": first.dtypes[0] if first.dtypes else None,
                      "reduce_op": first.reduce_op, "root": first.peer_global,
                      "describe": _describe(sig, first.shapes),
                      "callsite": rv.arrivals[ranks[0]].callsite})
    who = ", ".join(map(str, culprits))
    odd = vlist[1] if not tie else vlist[0]
    common = vlist[0] if not tie else None
    if rv.is_p2p:
        summary = _p2p_summary(rv)
    elif common is not None:
        summary = (f"rank{'s' if len(culprits) > 1 else ''} {who} issued {odd['describe']} "
                   f"where the others issued {common['describe']} ({rv.label()})")
    else:
        summary = (f"ranks disagree on {what} at {rv.label()}: "
                   + "; ".join(f"{v['ranks']} {v['describe']}" for v in vlist))
    if span_name:
        summary += f" in {span_name}"
    callsites = _callsites(rv, culprits)
    details = {"differs_in": fields, "variants": vlist, "group_desc": rv.group_desc,
               "arrived": sorted(rv.arrivals), "expected": list(rv.members)}
    if span_name:
        details["span"] = span_name
    return Finding("mismatch", "error", summary, culprits, rv.group, rv.seq, callsites,
                   details=details, remedy=_REMEDY)


def _p2p_summary(rv: Rendezvous) -> str:
    """'rank 0 sends 4x128 float32 to rank 1 at a.py:41; rank 1 receives 3x128 ... from
    rank 0 at a.py:40: the sizes disagree (p2p 0 -> 1 #3 in group 0)'."""
    src, dst = rv.key[2], rv.key[3]
    parts = []
    for rank, verb, prep, peer in ((src, "sends", "to", dst), (dst, "receives", "from", src)):
        ev = rv.arrivals.get(rank)
        if ev is None:
            continue
        shape = "+".join("x".join(map(str, s)) or "scalar" for s in ev.shapes[:2]) or (
            f"{ev.numel_in or ev.numel_out} elements")
        dtype = f" {ev.dtypes[0]}" if ev.dtypes else ""
        at = site_phrase(ev.callsite)
        parts.append(f"rank {rank} {verb} {shape}{dtype} {prep} rank {peer}{at}")
    sigs = [p2p_signature(e) for e in rv.arrivals.values()]
    what = "dtypes" if len({dict(g)["numel"] for g in sigs}) == 1 else "sizes"
    return f"{'; '.join(parts)}: the {what} disagree ({rv.label()})"


def _callsites(rv: Rendezvous, culprits: list[int]) -> list[dict]:
    """The culprits' call sites, and the others' where they differ from them."""
    out = [callsite_of(r, rv.arrivals[r].callsite) for r in culprits]
    seen = {(c["file"], c["line"]) for c in out}
    for rank, ev in sorted(rv.arrivals.items()):
        cs = callsite_of(rank, ev.callsite)
        if rank not in culprits and (cs["file"], cs["line"]) not in seen:
            seen.add((cs["file"], cs["line"]))
            out.append(cs)
    return out


_REMEDY = ("Make every rank of the group issue the same collectives in the same order with "
           "the same sizes and dtypes: look for rank-dependent branches (if rank == 0), "
           "uneven data (drop_last=False), or a tensor built differently on one rank. "
           "TORCH_DISTRIBUTED_DEBUG=DETAIL confirms it at a large cost per collective.")
