"""The collector (`distdoctor watch --listen`) attacked for real, over loopback only.

Each case starts the collector as a real process (some under a lowered `ulimit -n`) and
attacks it with real sockets (idle connections by the hundred and more connections than
descriptors: test_collector_descriptors.py, with this harness): a recorded session replayed, token guessing, escape codes and rich markup
in what a peer sends, a client certificate that names another host. A real node (the
forwarder `distdoctor run --forward` uses, or a peer that speaks the protocol through
distdoctor.collect.wire) must still get in, and the collector must say each thing once.
Every loop is bounded, every socket closed, every process stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import Lines, stop_process

from distdoctor.collect import tls, wire
from distdoctor.collect.forward import Forwarder
from distdoctor.launch.env import free_port
from distdoctor.runlog import format as F
from distdoctor.runlog.ring import RingWriter
from distdoctor.runlog.rundir import rank_meta_path, ring_path

TOKEN = "tok-attacks-0f9c"
ESCAPES = "\x1b[2J\x1b]0;owned\x07"  # clear the screen, retitle the window


class CollectorProcess:
    """`distdoctor watch --listen 127.0.0.1:PORT` as a service, stderr read line by line;
    `open_files`: its soft and hard RLIMIT_NOFILE (`ulimit -n`)."""

    def __init__(self, tmp_path, env: dict | None = None, open_files: int | None = None):
        self.port = free_port()
        limit = None
        if open_files is not None:
            def limit():
                resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "distdoctor", "watch", "--listen",
             f"127.0.0.1:{self.port}", str(tmp_path / "copy")],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, preexec_fn=limit,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
        self.said = Lines(self.proc)
        self.said.wait_for("collecting on", 30)

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    def text(self) -> str:
        return "".join(self.said.lines)

    def count(self, *words: str) -> int:
        return sum(all(w in line for w in words) for line in self.said.lines)

    def stop(self) -> int:
        return stop_process(self.proc, timeout_s=15)


@contextlib.contextmanager
def collector(tmp_path, **kwargs):
    c = CollectorProcess(tmp_path, **kwargs)
    try:
        yield c
    finally:
        c.stop()


def hello(host: str) -> bytes:
    return wire.json_frame(wire.HELLO, {"format": wire.FORMAT, "version": wire.VERSION,
                                        "host": host, "run": {}})


def simulated_node(address, host: str, source: str = "127.0.0.1",
                   timeout_s: float = 5.0) -> tuple[socket.socket, int | None, bytes]:
    """A peer that says HELLO (to a collector without a token): its socket, and the type
    and payload of the collector's answer (None: none came)."""
    sock = socket.create_connection(address, timeout=timeout_s, source_address=(source, 0))
    try:
        sock.sendall(hello(host))
        got = wire.read_frame(sock.makefile("rb").read)
    except (OSError, wire.WireError):
        got = None
    return sock, (got[0] if got else None), (got[3] if got else b"")


def real_node_gets_in(address, tmp_path, token: str | None = None, host: str | None = None,
                      tls_context=None) -> tuple[bool, str | None]:
    """The forwarder of `distdoctor run --forward` connects once: (welcomed, why not)."""
    fwd = Forwarder(tmp_path, address, token=token, tls=tls_context)
    if host is not None:
        fwd.host = host
    try:
        ok = fwd._connect(final=False)
        return ok, fwd._refused_by
    finally:
        if fwd._sock is not None:
            fwd._sock.close()


def _node_run_dir(run_dir) -> None:
    """A node's run dir with one rank's log of a few completed all_reduces."""
    (run_dir / "ranks").mkdir(parents=True)
    w = RingWriter(str(ring_path(run_dir, 0)), 0, 64 * F.SLOT_SIZE, 4096)
    rank_meta_path(run_dir, 0).write_text(json.dumps({"rank": 0, "host": "x", "pid": 1}))
    for seq in range(3):
        e = w.append(F.KIND_COLLECTIVE, F.OP_CODE["all_reduce"], 0, 0, 0, 0, seq, -1, 0, 1,
                     1, 1000 + seq, 0, 0)
        w.complete(e, F.STATUS_OK, 2000 + seq)
    w.close()


# --- the token ---------------------------------------------------------------------------------

class Recorder:
    """A one-connection relay that keeps every byte the node sent."""

    def __init__(self, target):
        self.target, self.sent = target, bytearray()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.thread = threading.Thread(target=self._relay, daemon=True)
        self.thread.start()

    def _relay(self) -> None:
        a, _ = self.server.accept()
        b = socket.create_connection(self.target)
        back = threading.Thread(target=self._pipe, args=(b, a, None), daemon=True)
        back.start()
        self._pipe(a, b, self.sent)
        back.join(timeout=5)

    @staticmethod
    def _pipe(src, dst, keep) -> None:
        try:
            while data := src.recv(65536):
                if keep is not None:
                    keep += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def _answers(address, data: bytes, timeout_s: float = 5.0) -> list[int]:
    """The frame types the collector answers `data` with, until it closes."""
    kinds = []
    with socket.create_connection(address, timeout=timeout_s) as sock:
        sock.sendall(data)
        reader = sock.makefile("rb")
        with contextlib.suppress(OSError, wire.WireError):
            while (got := wire.read_frame(reader.read)) is not None:
                kinds.append(got[0])
    return kinds


@pytest.mark.timeout(60)
def test_a_recorded_plaintext_session_replayed_is_refused(tmp_path):
    _node_run_dir(tmp_path / "node")
    with collector(tmp_path, env={"DISTDOCTOR_TOKEN": TOKEN}) as c:
        relay = Recorder(c.address)
        fwd = Forwarder(tmp_path / "node", ("127.0.0.1", relay.port), token=TOKEN)
        fwd.tick()
        fwd.stop()
        relay.thread.join(timeout=10)
        c.said.wait_for("connected", 10)
        kinds = _answers(c.address, bytes(relay.sent))
        assert wire.WELCOME not in kinds and wire.REFUSED in kinds, kinds
        assert len(relay.sent) > 500 and TOKEN.encode() not in relay.sent
        c.said.wait_for("wrong or missing token", 10)
        assert c.count("connected") == 1, c.text()


@pytest.mark.timeout(60)
def test_wrong_token_guesses_are_throttled_and_summed(tmp_path):
    """A guesser that tries as fast as it can gets a handful of answers judged in 6 s,
    not thousands; the collector says it in a few lines."""
    with collector(tmp_path, env={"DISTDOCTOR_TOKEN": TOKEN}) as c:
        judged = attempts = 0
        end = time.monotonic() + 6
        while time.monotonic() < end and attempts < 3000:
            ok, why = real_node_gets_in(c.address, tmp_path, token=f"guess-{attempts}")
            attempts += 1
            assert not ok
            judged += "wrong or missing token" in (why or "")
            time.sleep(0.002)
        time.sleep(0.5)
        assert attempts >= 50 and judged <= 8, (attempts, judged)
        assert c.count("refused") <= 3, c.text()
        ok, _ = real_node_gets_in(c.address, tmp_path / "other", token=TOKEN)
        assert c.proc.poll() is None


def test_refusals_are_one_line_per_peer_reason_and_minute_with_the_count():
    from distdoctor.collect.refusals import Refusals

    now, said = [0.0], []
    refusals = Refusals(said.append, clock=lambda: now[0])
    for i in range(1000):
        refusals.refused("10.0.0.9", 40000 + i, "wrong or missing token")
    refusals.refused("10.0.0.8", 1, "no HELLO within 5 s")
    assert said == ["refused 10.0.0.9:40000: wrong or missing token",
                    "refused 10.0.0.8:1: no HELLO within 5 s"]
    now[0] = 61.0
    refusals.flush_if_due()
    assert said[2:] == ["refused 10.0.0.9 999 more times in the last minute: wrong or "
                        "missing token"]
    for i in range(200):  # a peer that makes up a new reason each time: bounded
        refusals.refused("10.0.0.7", i, f"reason {i}")
    assert len(said) <= 3 + 8 + 1  # 8 reasons, then "other reasons"


@pytest.mark.timeout(60)
def test_an_old_node_is_told_to_upgrade_in_words_it_can_read(tmp_path):
    """A node of protocol 3 sends its token in HELLO: refused, in a version-3 frame."""
    payload = json.dumps({"format": wire.FORMAT, "version": 3, "host": "old",
                          "token": None, "run": {}}).encode()
    with collector(tmp_path) as c, socket.create_connection(c.address, timeout=5) as sock:
        sock.sendall(wire.FRAME.pack(wire.MAGIC, 3, wire.HELLO, 0, 0, 0, len(payload))
                     + payload)
        reader = sock.makefile("rb")
        _, version, kind, _, _, _, length = wire.FRAME.unpack(reader.read(wire.FRAME.size))
        assert (version, kind) == (3, wire.REFUSED), (version, wire.NAMES.get(kind))
        why = json.loads(reader.read(length)).get("why", "")
        assert "upgrade the node" in why, why


# --- identities ----------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_host_connected_from_another_address_is_refused_while_it_lives(tmp_path):
    with collector(tmp_path) as c:
        first, kind, _ = simulated_node(c.address, "twin", "127.0.0.1")
        assert kind == wire.WELCOME
        second, kind, why = simulated_node(c.address, "twin", "127.0.0.2")
        second.close()
        assert kind == wire.REFUSED and b"already connected" in why, why
        first.close()
        deadline = time.monotonic() + 5
        while True:  # once the first is gone, the name is free
            third, kind, _ = simulated_node(c.address, "twin", "127.0.0.2")
            third.close()
            if kind == wire.WELCOME or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert kind == wire.WELCOME, c.text()


@pytest.mark.timeout(60)
def test_with_client_certificates_a_hello_host_not_in_the_certificate_is_refused(
        tmp_path, tls_certs):
    node_tls = tls.TLSSettings(str(tls_certs.client), str(tls_certs.client_key),
                               str(tls_certs.ca)).client_context("run")
    with collector(tmp_path, env=tls_certs.server_env(require_clients=True)) as c:
        ok, why = real_node_gets_in(c.address, tmp_path, host="impostor",
                                    tls_context=node_tls)
        assert not ok and "certificate" in (why or ""), why
        ok, why = real_node_gets_in(c.address, tmp_path, tls_context=node_tls)
        assert ok, (why, c.text())  # its own name: in


# --- what a peer says reaches a terminal as text ----------------------------------------------

@pytest.mark.timeout(60)
def test_escape_codes_and_markup_from_peers_are_printed_as_text(tmp_path):
    finding = {"kind": "comm_error", "severity": "error", "ranks": [],
               "summary": f"{ESCAPES}NCCL error [bold]boom[/x]",
               "details": {"source": "log", "signature": "nccl/x"}}
    with collector(tmp_path) as c:
        bad_host, kind, _ = simulated_node(c.address, f"{ESCAPES}[/x]evil")
        bad_host.close()
        assert kind == wire.REFUSED
        sock, kind, _ = simulated_node(c.address, "marked")
        assert kind == wire.WELCOME
        sock.sendall(wire.json_frame(wire.META, {"rank": f"[/x]{ESCAPES}"}, rank=0))
        sock.close()
        c.said.wait_for("describes rank", 10)
        sock, kind, _ = simulated_node(c.address, "finder")
        sock.sendall(wire.json_frame(wire.FINDINGS, {"findings": [finding]}))
        c.said.wait_for("boom", 10)
        sock.close()
        ok, why = real_node_gets_in(c.address, tmp_path)
        assert ok and c.proc.poll() is None, (why, c.text())
    text = c.text()
    assert "\x1b" not in text and "\x07" not in text, repr(text)
    assert "[/x]" in text and "Traceback" not in text and "MarkupError" not in text, text


@pytest.mark.timeout(30)
def test_a_collectors_refusal_reaches_the_nodes_terminal_as_text(tmp_path, capsys):
    server = socket.create_server(("127.0.0.1", 0))

    def refuse_once():
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(wire.json_frame(wire.REFUSED, {"why": f"{ESCAPES}go away[/x]"}))

    t = threading.Thread(target=refuse_once, daemon=True)
    t.start()
    try:
        ok, why = real_node_gets_in(server.getsockname(), tmp_path)
    finally:
        t.join(timeout=5)
        server.close()
    err = capsys.readouterr().err
    assert not ok and "go away" in err and "\x1b" not in err and "\x07" not in err, repr(err)

