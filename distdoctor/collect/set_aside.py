"""Copies of a rank's logs whose claim was disproven (claims.py: a launch shown false by
the node that ran the rank on; a first claim that never showed the rank running before
the node that runs it took it): they were never that rank's, and must not read as it.

A reader that follows the copy already (the collector's own viewer) has the file open:
its header is marked as a rank that left through exit status 0, so that reader lets the
log go as finished (not as a rank whose heartbeat stopped: a crash of the real rank).
Then the file and its metadata go to RUN_DIR/set-aside/ (owners.aside_path), out of
ranks/, where the readers of the copy that come after (diagnose, a viewer started later,
a collector started again) never see them; their number stays taken (Owners.next_log).
"""

from __future__ import annotations

import os

from distdoctor.collect.copies import Copy, OpenCopies
from distdoctor.collect.owners import aside_path
from distdoctor.runlog.rundir import rank_meta_path


def put_aside(copy: Copy, copies: OpenCopies, run_dir) -> None:
    """`copy` closed for its readers and moved out of ranks/ (an error leaves it where it
    is: a full disk, the file gone under us)."""
    try:
        with copies.writing(copy) as ring:
            ring.mark_exited(0)
    except (OSError, ValueError):
        pass
    copies.forget(copy)
    meta = rank_meta_path(run_dir, *copy.key)
    for path in (copy.path, meta):
        target = aside_path(path)
        try:
            target.parent.mkdir(mode=0o755, exist_ok=True)
            if not os.path.islink(target.parent):  # (the run dir is ours: no link in it)
                os.rename(path, target)
        except OSError:
            pass
