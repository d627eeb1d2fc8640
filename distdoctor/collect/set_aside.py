"""Copies of a rank's logs whose claim was disproven (claims.py: a launch shown false by
the node that ran the rank on; a first claim that never showed the rank running before
the node that runs it took it): they were never that rank's, and must not read as it.

A reader that follows the copy already (the collector's own viewer) has the file open:
its header is marked as a rank that left through exit status 0, so that reader lets the
log go as finished (not as a rank whose heartbeat stopped: a crash of the real rank).
Then the file and its metadata go to RUN_DIR/set-aside/ (private to the collector's
user, reached by no link: aside_dir), out of ranks/, where the readers of the copy that
come after (diagnose, a viewer started later, a collector started again) never see them;
their number stays taken (Owners.next_log).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from distdoctor.collect.copies import Copy, OpenCopies
from distdoctor.collect.owners import ASIDE_DIR
from distdoctor.privatefiles import PrivateDir, PrivateDirRefused
from distdoctor.runlog.rundir import rank_meta_path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC


def put_aside(copy: Copy, copies: OpenCopies, run_dir) -> None:
    """`copy` closed for its readers and moved out of ranks/ (an error leaves it where it
    is: a full disk, the file gone under us, a set-aside/ that is not ours)."""
    try:
        with copies.writing(copy) as ring:
            ring.mark_exited(0)
    except (OSError, ValueError):
        pass
    copies.forget(copy)
    aside = aside_dir(Path(run_dir))
    if aside is None:
        return
    with aside:
        for path in (copy.path, rank_meta_path(run_dir, *copy.key)):
            try:  # (renamed into the checked directory's descriptor: no link followed)
                os.rename(path, path.name, dst_dir_fd=aside.fd)
            except OSError:
                pass


def aside_dir(run_dir: Path) -> PrivateDir | None:
    """RUN_DIR/set-aside/, open: made 0700 and checked as a private dir is
    (privatefiles.PrivateDir: a directory of this user, reached by no link). What goes
    there is a peer's word (a squatter's logs, a forged launch's), not the job's: only
    the collector's user reads it. One that an older collector made 0755 is made
    private; a link or another user's directory there is not used (None: the logs stay
    in ranks/, marked as finished)."""
    path = os.fspath(run_dir / ASIDE_DIR)
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        fd = None
    except OSError:  # a link (ELOOP), a file (ENOTDIR)
        return None
    if fd is not None:
        try:
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
                os.fchmod(fd, 0o700)
        except OSError:
            pass
        finally:
            os.close(fd)
    try:
        return PrivateDir.open(path)
    except PrivateDirRefused:
        return None
