"""A process group's creation in the rank's log.

torch names a group made by `new_group()` by how many groups the rank has created before
it, and every rank takes part in every creation (non-members too: they get
NON_GROUP_MEMBER), so what each rank created, in which order and where it stands while one
never ends is the evidence for groups created in rank-dependent orders (the diagnosis in
hangs/group_order.py). No op of the group is needed for it: a rank can be stuck inside
`new_group()` before any. One implicit span per creation (F.SPAN_NEW_GROUP), whose group
fields are the new group's, opened before torch builds it and closed after; never on the
spans stack (samples taken while it runs belong to the step around it).
"""

from __future__ import annotations

import time

from distdoctor.runlog import format as F
from distdoctor.tracer.support import warn_once


def creation_begin(rec, args: tuple, kwargs: dict) -> int | None:
    """Record that this rank began creating the group `_new_process_group_helper` is
    called for (positional or keyword, as torch calls it); None where nothing was."""
    try:
        ranks = args[2] if len(args) > 2 else kwargs.get("global_ranks_in_group")
        name = args[5] if len(args) > 5 else kwargs.get("group_name")
        if not ranks or name is None:
            return None  # the default group, or a torch whose helper reads otherwise
        ranks, name = [int(r) for r in ranks], str(name)
        desc = str(kwargs.get("group_desc") or "")
        group_id = rec.intern("group", (name, desc, tuple(ranks)),
                              {"name": name, "desc": desc, "ranks": ranks, "size": len(ranks)})
        name_id = rec.intern("span", F.SPAN_NEW_GROUP, F.SPAN_NEW_GROUP)
        site_id, _ = rec.sites.current()
        spans = rec._spans
        return rec.ring.append(F.KIND_SPAN, F.OP_CODE["span"], F.REDOP_NONE,
                               F.FLAG_IMPLICIT, group_id, site_id, 0, -1, 0, 0, 0,
                               time.monotonic_ns(), spans[-1] + 1 if spans else 0, name_id)
    except Exception as exc:  # never into user code
        warn_once("new_group", f"could not record a group's creation: {exc!r}")
        return None


def creation_end(rec, e: int | None, failed: bool) -> None:
    if e is not None:
        rec.span_end(e, failed)
