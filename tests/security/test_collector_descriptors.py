"""The collector attacked through its descriptors, over loopback only (the harness:
test_collector_attacks.py): idle connections by the hundred, reopened as they are
dropped, against a collector under a lowered `ulimit -n`, and more nodes than it may open
files for. A real node must still get in, and the shortage is said once.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time

import pytest
from simnode import closed_ones
from test_collector_attacks import collector, hello, real_node_gets_in

from distdoctor.collect import wire


class IdleFlood:
    """`n` connections that never say a word, reopened as the collector closes them (a
    flood that keeps up its pressure), in a thread, at most `budget` opened in all."""

    def __init__(self, address, n: int, budget: int = 20_000):
        self.address, self.n, self.budget = address, n, budget
        self.socks: list[socket.socket] = []
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep_up, daemon=True)

    def __enter__(self) -> IdleFlood:
        for _ in range(self.n):
            self._open()
        self._thread.start()
        return self

    def _open(self) -> None:
        try:
            self.socks.append(socket.create_connection(self.address, timeout=2))
            self.opened += 1
        except OSError:
            pass

    def _keep_up(self) -> None:
        while not self._stop.wait(0.05) and self.opened < self.budget:
            for s in closed_ones(self.socks):  # closed by the collector: opened again
                self.socks.remove(s)
                s.close()
            while len(self.socks) < self.n and self.opened < self.budget:
                self._open()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for s in self.socks:
            s.close()


# --- descriptors and connections -------------------------------------------------------------

@pytest.mark.timeout(60)
def test_idle_unauthenticated_connections_never_keep_a_real_node_out(tmp_path):
    """300 idle sockets, reopened as they are dropped, against a collector that may open
    256 files: a real node gets in 5 times of 5."""
    with collector(tmp_path, open_files=256) as c, IdleFlood(c.address, 300) as flood:
        time.sleep(1.0)
        for attempt in range(5):
            ok, why = real_node_gets_in(c.address, tmp_path)
            assert ok, (attempt, why, flood.opened, c.text())
        assert c.proc.poll() is None
    assert flood.opened >= 300
    assert "Traceback" not in c.text()
    assert c.count("refused") <= 3, c.text()  # summed, not a line each


def _answered(socks: list[socket.socket], timeout_s: float) -> tuple[list, int]:
    """Those of `socks` the collector answered within `timeout_s`: the ones welcomed,
    and how many it closed instead (an idle one dropped to make room: a real node would
    try again). Every answered one leaves `socks`."""
    welcomed, dropped = [], 0
    deadline = time.monotonic() + timeout_s
    while socks and time.monotonic() < deadline:
        ready, _, _ = select.select(socks, [], [], 0.2)
        for s in ready:
            socks.remove(s)
            got = None
            with contextlib.suppress(OSError, wire.WireError):
                got = wire.read_frame(s.makefile("rb").read)
            if got is not None and got[0] == wire.WELCOME:
                welcomed.append(s)
            else:
                dropped += 1
                s.close()
    return welcomed, dropped


@pytest.mark.timeout(60)
def test_out_of_descriptors_is_said_once_and_the_collector_accepts_again(tmp_path):
    """60 nodes connect to a collector that may open 48 files: those that do not fit
    wait, the shortage is said once with the limit and the remedy, and as nodes leave
    the waiting ones get in, and then a real node."""
    with collector(tmp_path, open_files=48) as c:
        socks = []
        for i in range(60):
            sock = socket.create_connection(c.address, timeout=5)
            sock.sendall(hello(f"held-{i:03d}"))
            socks.append(sock)
        welcomed, dropped = _answered(socks, 3)
        assert socks and welcomed, (len(welcomed), c.text())  # some had to wait
        c.said.wait_for("EMFILE", 10)
        got_in = len(welcomed)
        deadline = time.monotonic() + 30
        while socks and time.monotonic() < deadline:  # nodes leave, others come in
            for s in welcomed:
                s.close()
            welcomed, more = _answered(socks, 2)
            got_in, dropped = got_in + len(welcomed), dropped + more
        for s in socks + welcomed:
            s.close()
        assert not socks and got_in >= 50, (got_in, dropped, c.text())  # none left deaf
        time.sleep(0.5)
        ok, why = real_node_gets_in(c.address, tmp_path)
        assert ok, (why, c.text())
        assert c.proc.poll() is None
    line = [x for x in c.said.lines if "EMFILE" in x]
    assert len(line) == 1 and "ulimit -n" in line[0] and "48" in line[0], c.text()
    assert "Traceback" not in c.text()
