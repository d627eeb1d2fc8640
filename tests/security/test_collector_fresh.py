"""The collector (`distdoctor watch --listen`) against what its earlier attack tests left
out, on loopback only: peers that come and go under names of their own.

Each case runs a real collector (its event loop on its own thread) and real peers over
loopback sockets; every loop is bounded, every socket closed, the collector stopped.
"""

from __future__ import annotations

import gc
import socket
import time
import tracemalloc

import pytest
from simnode import hello, reply

from distdoctor.collect import wire
from distdoctor.collect.server import Collector, listen


def _comes_and_goes(address, names: range) -> None:
    """A peer that says HELLO under each name in turn, is welcomed and leaves."""
    for i in names:
        with socket.create_connection(address, timeout=10) as s:
            s.sendall(hello(f"cycled-{i:06d}.{'x' * 200}"))
            got = reply(s)
            assert got is not None and got[0] == wire.WELCOME, got


def _settled(collector: Collector, timeout_s: float = 10) -> None:
    """Every connection's end seen by the collector's loop."""
    deadline = time.monotonic() + timeout_s
    while collector._conns and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.timeout(60)
def test_host_names_cycled_by_a_peer_leave_nothing_held(tmp_path):
    """A peer that connects under a new host name each time, sends no rank and leaves
    (anyone, at a loopback collector without a token; a node whose host name is new at
    each start): every name stayed, its last connection's state held, for the copy's
    life (3,000 names: 3.6 MiB more; a million, gigabytes), and the pass for lost nodes
    read them all. A host gone that owns no rank is now forgotten."""
    lines: list[str] = []
    collector = Collector(tmp_path / "copy", listen(("127.0.0.1", 0)), None,
                          lines.append).start()
    try:
        _comes_and_goes(collector.address, range(200))  # (the loop's own warm-up)
        _settled(collector)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            _comes_and_goes(collector.address, range(200, 3200))
            _settled(collector)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert grown < 1 << 20, f"3,000 names gone hold {grown / 2**20:.1f} MiB"
    finally:
        collector.stop()
