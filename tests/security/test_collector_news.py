"""What the collector (`distdoctor watch --listen`, a real process on loopback) says of its
nodes and of itself, against peers that make it talk: a node that reconnects in a loop,
one certificate's holder under another spelling of its name, an IPv6 listen address.
Bounded in connections and time; each case failed on the code before its fix."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from simnode import CollectorProcess, connect_node, hello  # noqa: E402

from distdoctor.collect import tls, wire  # noqa: E402
from distdoctor.launch.env import free_port  # noqa: E402


@pytest.mark.timeout(60)
def test_a_node_reconnecting_in_a_loop_costs_a_few_lines(tmp_path):
    """100 connections of one node (no token on loopback), each closed at once: two
    lines each (connected, lost), 200 in all. Now the first 3 of each kind are said (a
    reconnection or two is news) and the rest summed once a minute; another node's
    coming is still said at once."""
    c = CollectorProcess(tmp_path / "copy", tmp_path / "collector.txt").started()
    try:
        for _ in range(100):
            connect_node(c.address, "looper").close()
        other = connect_node(c.address, "other")
        c.wait_for("node other", 10)
        lines = [x for x in c.text().splitlines() if "node looper" in x]
        assert 2 <= len(lines) <= 6, lines[:10]
        other.close()
    finally:
        c.stop()


def test_comings_and_goings_are_summed_once_a_minute():
    from distdoctor.collect.refusals import NodeNews

    now = [0.0]
    said: list[str] = []
    news = NodeNews(said.append, clock=lambda: now[0])
    for i in range(50):
        news.news("looper", "connected", f"node looper (127.0.0.1:{4000 + i}) connected")
    news.news("other", "connected", "node other (127.0.0.1:5000) connected")
    assert said == [f"node looper (127.0.0.1:{4000 + i}) connected" for i in range(3)] + [
        "node other (127.0.0.1:5000) connected"]
    now[0] = 61.0
    news.flush_if_due()
    assert said[4:] == ["node looper connected 47 more times in the last minute (the newest: "
                        "node looper (127.0.0.1:4049) connected)"]


def _tls_node(address, context, host: str, source: str):
    """A node over TLS from `source` naming `host`: its socket and the collector's reply."""
    raw = socket.create_connection(address, timeout=10, source_address=(source, 0))
    sock = context.wrap_socket(raw, server_hostname="localhost")
    sock.sendall(hello(host))
    return sock, wire.read_frame(sock.makefile("rb").read, wire.MAX_HELLO)


@pytest.mark.timeout(60)
def test_one_certificate_is_one_node_whatever_the_case_of_its_name(tmp_path, tls_certs,
                                                                   monkeypatch):
    """A client certificate for node7 let its holder be NODE7 and Node7. too (names
    match as DNS does, whatever their case): as many nodes as spellings, each its own
    host, another address's twin welcomed. Under client certificates a node is its
    certificate's spelling: the twin is refused while the first lives."""
    for key, value in tls_certs.server_env(require_clients=True).items():
        monkeypatch.setenv(key, value)
    node = tls_certs.client_for("node7")
    context = tls.TLSSettings(node["DISTDOCTOR_TLS_CERT"], node["DISTDOCTOR_TLS_KEY"],
                              str(tls_certs.ca)).client_context("run")
    c = CollectorProcess(tmp_path / "copy", tmp_path / "collector.txt").started()
    try:
        first, got = _tls_node(c.address, context, "node7", "127.0.0.1")
        assert got is not None and got[0] == wire.WELCOME, (got, c.text())
        twin, got = _tls_node(c.address, context, "NODE7", "127.0.0.2")
        assert got is not None and got[0] == wire.REFUSED, (got, c.text())
        assert b"already connected" in got[3], got
        first.close()
        twin.close()
    finally:
        c.stop()


@pytest.mark.timeout(60)
def test_an_ipv6_listen_address_is_said_with_brackets(tmp_path):
    """`collecting on ::1:7070` reads as a port-less address; an IPv6 address is written
    [::1]:7070, as --listen takes it."""
    port = free_port()
    out = tmp_path / "collector.txt"
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "distdoctor", "watch", "--listen",
                                 f"[::1]:{port}", str(tmp_path / "copy")],
                                stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            deadline = time.monotonic() + 30
            while "collecting on" not in out.read_text() and proc.poll() is None:
                assert time.monotonic() < deadline, out.read_text()
                time.sleep(0.05)
        finally:
            proc.terminate()
            proc.wait(15)
    assert f"collecting on [::1]:{port} " in out.read_text(), out.read_text()
