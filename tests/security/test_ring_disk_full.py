"""Disk full once, refused forever (issue 46, item 5): a failed creation of a log's copy
left `.rank-N.ring.<pid>.<thread-id>.tmp` behind, and thread ids are reused, so every
reconnection then failed with `File exists`, even after space was freed. On a real small
tmpfs (root only; skipped elsewhere): the node is refused with one line while the disk is
full, leaves no temp file, and gets in on its next connection once there is room."""

from __future__ import annotations

import os

import pytest
from conftest import small_disk
from simnode import CollectorProcess, connect_node, dropped, meta, open_log, send, state, until

from distdoctor.collect import wire


def _fill(path, leave_bytes: int) -> None:
    """A file that takes all but `leave_bytes` of the file system at `path`."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    with open(path / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(0, free - leave_bytes))


@pytest.mark.timeout(60)
def test_a_node_refused_for_a_full_disk_gets_in_once_there_is_room(tmp_path):
    with small_disk(tmp_path / "disk", "24m") as disk:
        copy = disk / "copy"
        c = CollectorProcess(copy, tmp_path / "collector.out").started()
        try:
            _fill(disk, 256 << 10)  # room for metadata, none for a log's 1 MiB reserve
            for _ in range(3):  # each connection tries again, on the same server thread
                node = connect_node(c.address, "node")
                send(node, meta(0, "node"), open_log(0, capacity=wire.MIRROR_SLOTS))
                assert dropped(node)
            text = c.wait_for("space left on the device")
            assert "File exists" not in text and "Traceback" not in text
            assert not [p.name for p in (copy / "ranks").iterdir() if p.name.endswith(".tmp")]
            assert not (copy / "ranks" / "rank-00000.ring").exists()
            (disk / "filler").unlink()  # room again: the next connection gets in
            node = connect_node(c.address, "node")
            assert send(node, meta(0, "node"), open_log(0, capacity=wire.MIRROR_SLOTS),
                        state(0))
            until(lambda: (copy / "ranks" / "rank-00000.ring").exists(), what="the copy")
            assert not dropped(node, timeout_s=1), c.text()[-2000:]
            node.close()
            assert "File exists" not in c.text()
        finally:
            c.stop()
