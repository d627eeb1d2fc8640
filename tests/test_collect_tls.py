"""TLS between the nodes and the collector (collect/tls.py): a real 2-rank gloo job
forwarded over TLS with a client certificate, through a relay that records every byte;
a plaintext node, a node with the wrong CA and a node without a client certificate get
nothing in, and their jobs run to their normal end; bad settings are one line."""

from __future__ import annotations

import socket
import ssl
import threading
import time

import pytest
from conftest import JOBS, Lines, run_cli, start_cli, stop_process

from distdoctor.collect import tls
from distdoctor.collect.forward import Forwarder
from distdoctor.collect.server import Collector, listen
from distdoctor.launch.env import free_port

JOB = JOBS / "tls" / "secret_steps.py"
TOKEN = "tok-7f3a-do-not-leak"
STEPS = "".join(f"step {i}: {2 ** (i + 1)}\n" for i in range(5))  # its output, 2 ranks


class Relay:
    """A TCP relay between the node and the collector that keeps what passes, both ways."""

    def __init__(self, target: tuple[str, int]):
        self.target, self.seen = target, bytearray()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                a, _ = self.server.accept()
            except OSError:
                return
            b = socket.create_connection(self.target)
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()


def _collector(tmp_path, env: dict) -> tuple:
    port = free_port()
    proc = start_cli(["watch", "--listen", f"127.0.0.1:{port}", str(tmp_path / "copy")],
                     env={"DISTDOCTOR_TOKEN": TOKEN, **env})
    said = Lines(proc)
    said.wait_for("collecting on", 30)
    return proc, said, port


def _node(tmp_path, port: int, env: dict, name: str = "node"):
    return run_cli(["run", "--nproc", "2", "--run-dir", str(tmp_path / name), "--forward",
                    f"127.0.0.1:{port}", "--", str(JOB)], timeout=90,
                   env={"DISTDOCTOR_TOKEN": TOKEN, **env}, run_dir=tmp_path / name)


def _copied_rings(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "copy" / "ranks").glob("*.ring"))


@pytest.mark.timeout(150)
def test_a_job_forwarded_over_tls_with_a_client_certificate_crosses_the_wire_unreadable(
        tmp_path, tls_certs):
    collector, said, port = _collector(tmp_path, tls_certs.server_env(require_clients=True))
    relay = Relay(("127.0.0.1", port))
    try:
        node = _node(tmp_path, relay.port, tls_certs.node_env(client_cert=True))
        said.wait_for("finished", 20)
    finally:
        relay.close()
        stop_process(collector)
    assert node.returncode == 0 and node.stdout == STEPS, node.stderr
    assert "forwarding to the collector" in node.stderr and "over TLS" in node.stderr
    assert "in clear" not in node.stderr
    assert "(over TLS, client certificates required)" in said.lines[0], said.lines
    assert _copied_rings(tmp_path) == ["rank-00000.ring", "rank-00001.ring"]
    assert len(relay.seen) > 8_000  # the logs went through the relay ...
    wire = bytes(relay.seen)  # ... and none of it is readable there
    for secret in (TOKEN, str(JOB), "secret_steps.py", "distdoctor-forward", "DDFW"):
        assert secret.encode() not in wire, secret
    assert "Traceback" not in node.stderr + "".join(said.lines)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", ["plaintext", "wrong CA"])
def test_a_refused_node_gets_nothing_in_and_its_job_runs_to_its_end(tmp_path, tls_certs,
                                                                    case):
    collector, said, port = _collector(tmp_path, tls_certs.server_env())
    env = {} if case == "plaintext" else tls_certs.node_env(ca=tls_certs.other_ca)
    try:
        node = _node(tmp_path, port, env)
        line = said.wait_for("distdoctor: refused", 20)
    finally:
        stop_process(collector)
    assert node.returncode == 0 and node.stdout == STEPS, node.stderr
    told = [x for x in node.stderr.splitlines() if "collector" in x]
    assert len(told) == 1, node.stderr
    if case == "plaintext":
        assert "no TLS handshake" in line, line
        assert "TLS" in told[0], told
    else:
        assert "failed verification" in told[0] and "DISTDOCTOR_TLS_CA" in told[0], told
    assert sum(x.startswith("distdoctor: refused") for x in said.lines) == 1, said.lines
    assert _copied_rings(tmp_path) == [] and "connected" not in "".join(said.lines)
    assert "Traceback" not in node.stderr + "".join(said.lines)


# --- client certificates, in process -----------------------------------------------------

def _ring(run_dir) -> None:
    import json

    from distdoctor.runlog import format as F
    from distdoctor.runlog.ring import RingWriter
    from distdoctor.runlog.rundir import rank_meta_path, ring_path

    (run_dir / "ranks").mkdir(parents=True)
    w = RingWriter(str(ring_path(run_dir, 0)), 0, 64 * F.SLOT_SIZE, 4096)
    rank_meta_path(run_dir, 0).write_text(json.dumps({"rank": 0, "host": "x", "pid": 1}))
    for seq in range(3):
        e = w.append(F.KIND_COLLECTIVE, F.OP_CODE["all_reduce"], 0, 0, 0, 0, seq, -1, 0, 1,
                     1, 1000 + seq, 0, 0)
        w.complete(e, F.STATUS_OK, 2000 + seq)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("client", ["none", "stranger", "node"])
def test_a_collector_that_requires_client_certificates_lets_in_only_its_cas(
        tmp_path, tls_certs, client, capsys):
    c = tls_certs
    server = tls.TLSSettings(str(c.server), str(c.server_key), str(c.ca))
    said: list[str] = []
    collector = Collector(tmp_path / "copy", listen(("127.0.0.1", 0), server), None,
                          said.append).start()
    cert = {"none": (None, None), "stranger": (c.other_client, c.other_client_key),
            "node": (c.client, c.client_key)}[client]
    node_tls = tls.TLSSettings(*(str(p) if p else None for p in cert), str(c.ca))
    _ring(tmp_path / "node")
    try:
        fwd = Forwarder(tmp_path / "node", collector.address,
                        tls=node_tls.client_context("run"))
        fwd.tick()
        fwd.stop()
        err = capsys.readouterr().err
        _wait(lambda: said)
        if client == "node":  # "connected" is said before the frames are read and written
            _wait(lambda: _copied_rings(tmp_path))
    finally:
        collector.stop()
    if client == "node":
        assert "forwarding to the collector" in err and said[0].endswith("connected"), said
        assert _copied_rings(tmp_path) == ["rank-00000.ring"]
        return
    assert err.count("refused this node") == 1, err
    assert len(said) == 1 and said[0].startswith("refused"), said
    if client == "none":
        assert "client certificate" in said[0] and "client certificate" in err, (said, err)
    assert _copied_rings(tmp_path) == []


# --- bad settings: one line, exit 2, nothing bound or written -------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("command,bad", [
    (command, bad) for command in ("run", "watch", "metrics")
    for bad in ("missing cert", "key that does not match", "CA only")
    if (command, bad) != ("run", "CA only")])  # a node may verify with no certificate
def test_bad_tls_settings_get_one_line_and_a_non_zero_exit(tmp_path, tls_certs, command,
                                                           bad):
    c = tls_certs
    env = {"missing cert": {"DISTDOCTOR_TLS_CERT": str(tmp_path / "nope.pem"),
                            "DISTDOCTOR_TLS_KEY": str(c.server_key)},
           "key that does not match": {"DISTDOCTOR_TLS_CERT": str(c.server),
                                       "DISTDOCTOR_TLS_KEY": str(c.client_key)},
           "CA only": {"DISTDOCTOR_TLS_CA": str(c.ca)}}[bad]
    args = {"run": ["run", "--run-dir", str(tmp_path / "run"), "--forward", "127.0.0.1:9",
                    "--", "true"],
            "watch": ["watch", "--listen", f"127.0.0.1:{free_port()}", str(tmp_path / "run")],
            "metrics": ["run", "--run-dir", str(tmp_path / "run"), "--metrics",
                        f"127.0.0.1:{free_port()}", "--", "true"]}[command]
    out = run_cli(args, timeout=30, env=env)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "TLS" in lines[0] and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()


def test_flags_win_over_the_environment(tls_certs):
    s = tls.settings(cert="flag.pem", env={tls.CERT: "env.pem", tls.CA: "ca.pem"})
    assert (s.cert, s.key, s.ca) == ("flag.pem", None, "ca.pem")
    assert not tls.settings(env={}).enabled
    assert isinstance(tls.settings(ca=str(tls_certs.ca), env={}).client_context("run"),
                      ssl.SSLContext)


@pytest.mark.timeout(60)
def test_without_tls_off_loopback_run_and_watch_say_once_that_all_travels_in_clear(tmp_path):
    port = free_port()
    watch = start_cli(["watch", "--listen", f"0.0.0.0:{port}", str(tmp_path / "copy")],
                      env={"DISTDOCTOR_TOKEN": TOKEN})
    said = Lines(watch)
    try:
        said.wait_for("collecting on", 30)
        node = run_cli(["run", "--nproc", "1", "--run-dir", str(tmp_path / "node"),
                        "--forward", f"0.0.0.0:{port}", "--", "python", "-c", "print(1)"],
                       timeout=40, env={"DISTDOCTOR_TOKEN": TOKEN}, run_dir=tmp_path / "node")
    finally:
        stop_process(watch)
    assert node.returncode == 0 and node.stdout == "1\n", node.stderr
    assert node.stderr.count("travel in clear") == 1, node.stderr
    assert "".join(said.lines).count("travel in clear") == 1, said.lines


def _wait(predicate, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.timeout(60)
def test_the_relay_would_see_a_plaintext_stream_but_never_its_token(tmp_path):
    """The wire check's control: without TLS the same relay records the frames, so their
    absence above is TLS's doing; the token is not among them even so (the node answers
    the collector's challenge with an HMAC: collect/auth.py)."""
    said: list[str] = []
    collector = Collector(tmp_path / "copy", listen(("127.0.0.1", 0), tls.TLSSettings()),
                          TOKEN, said.append).start()
    relay = Relay(collector.address)
    _ring(tmp_path / "node")
    try:
        fwd = Forwarder(tmp_path / "node", ("127.0.0.1", relay.port), token=TOKEN)
        fwd.tick()
        fwd.stop()
        _wait(lambda: _copied_rings(tmp_path))
    finally:
        relay.close()
        collector.stop()
    assert b"DDFW" in relay.seen and b"distdoctor-forward" in relay.seen
    assert TOKEN.encode() not in relay.seen


@pytest.mark.timeout(60)
def test_a_node_refused_again_and_again_is_one_line_on_each_side(tmp_path, tls_certs,
                                                                capsys):
    c = tls_certs
    said: list[str] = []
    server = tls.TLSSettings(str(c.server), str(c.server_key))
    collector = Collector(tmp_path / "copy", listen(("127.0.0.1", 0), server), None,
                          said.append).start()
    _ring(tmp_path / "node")
    try:
        fwd = Forwarder(tmp_path / "node", collector.address)  # plaintext
        for _ in range(3):
            fwd._next_try_s = 0.0  # as if its 30 s back-off had passed
            fwd.tick()
        fwd.stop()
        _wait(lambda: said)
        time.sleep(0.5)
    finally:
        collector.stop()
    assert len(said) == 1 and "no TLS handshake" in said[0], said
    assert capsys.readouterr().err.count("refused this node") == 1
    assert _copied_rings(tmp_path) == []


@pytest.mark.timeout(60)
def test_watch_takes_the_tls_flags_too(tmp_path, tls_certs):
    """`watch --listen` with --tls-cert/--tls-key as `run` has them: a missing file is one
    line and exit 2, nothing bound or written."""
    out = run_cli(["watch", "--listen", f"127.0.0.1:{free_port()}", str(tmp_path / "run"),
                   "--tls-cert", str(tmp_path / "nope.pem"),
                   "--tls-key", str(tls_certs.server_key)], timeout=30)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "nope.pem" in lines[0], out.stderr
    assert not (tmp_path / "run").exists()
