"""A simulated node and a real collector process, for the collector's security tests.

`connect_node` is the one place that speaks the forwarding handshake (HELLO, then the
answer to the collector's CHALLENGE when it has a token), so the tests stay independent
of how nodes prove who they are. The collector is `python -m distdoctor watch --listen`,
a real process on loopback, with its output in a file and a hard stop."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from distdoctor.collect import wire
from distdoctor.launch.env import free_port

CAPACITY, STRINGS = 16, 4096  # the smallest log layout a node may send


def connect_node(address: tuple[str, int], host: str, token: str | None = None,
                 timeout_s: float = 10) -> socket.socket:
    """A node's connection, welcomed (AssertionError with the refusal otherwise)."""
    sock = socket.create_connection(address, timeout=timeout_s)
    challenge = getattr(wire, "CHALLENGE", None)
    hello = {"format": wire.FORMAT, "version": wire.VERSION, "host": host,
             "instance": f"test-{host}", "run": {}}
    if challenge is None:  # (a collector before challenge and response: the token in HELLO)
        hello["token"] = token
    sock.sendall(wire.json_frame(wire.HELLO, hello))
    reader = sock.makefile("rb")
    got = wire.read_frame(reader.read, wire.MAX_HELLO)
    if got is not None and challenge is not None and got[0] == challenge:
        from distdoctor.collect import auth

        answer = auth.answer(token, got[3], host) if token else None
        sock.sendall(wire.json_frame(wire.AUTH, {"answer": answer}))
        got = wire.read_frame(reader.read, wire.MAX_HELLO)
    assert got is not None and got[0] == wire.WELCOME, f"not welcomed: {got!r}"
    return sock


def send(sock: socket.socket, *frames: bytes) -> bool:
    """False when the collector has closed the connection (it dropped the node)."""
    try:
        for f in frames:
            sock.sendall(f)
        return True
    except OSError:
        return False


def dropped(sock: socket.socket, timeout_s: float = 10) -> bool:
    """Whether the collector closes this connection within `timeout_s`."""
    sock.settimeout(timeout_s)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except TimeoutError:
        return False
    except OSError:
        return True


def meta(rank: int, host: str, **extra) -> bytes:
    return wire.json_frame(wire.META, {"rank": rank, "host": host, "pid": 1000 + rank,
                                       **extra}, rank=rank)


def open_log(rank: int, capacity: int = CAPACITY, pid: int | None = None,
             log: int = 0) -> bytes:
    return wire.frame(wire.OPEN, wire.OPEN_BODY.pack(capacity, STRINGS,
                                                     1000 + rank if pid is None else pid),
                      rank, log=log)


def state(rank: int, head: int = 0, log: int = 0) -> bytes:
    now = time.monotonic_ns()
    return wire.frame(wire.STATE, wire.STATE_BODY.pack(head, 0, 0, 0, now, time.time_ns(),
                                                       0, 0, 0), rank, log=log)


def exits(entries: list[dict]) -> bytes:
    return wire.json_frame(wire.EXITS, {"processes": entries})


class CollectorProcess:
    """`distdoctor watch --listen 127.0.0.1:PORT RUN_DIR`, stdin /dev/null (service mode);
    `ulimit_n`: its open-files limit (soft and hard), set in a shell before it starts;
    `args`: more of watch's options (`--metrics HOST:PORT`)."""

    def __init__(self, run_dir: Path, out: Path, ulimit_n: int | None = None,
                 port: int | None = None, args: tuple = ()):
        self.port = port or free_port()
        self.address = ("127.0.0.1", self.port)
        self.out_path = out
        argv = [sys.executable, "-m", "distdoctor", "watch", "--listen",
                f"127.0.0.1:{self.port}", *args, str(run_dir)]
        if ulimit_n is not None:
            argv = ["bash", "-c", f"ulimit -n {ulimit_n} && exec \"$@\"", "collector", *argv]
        self._out = open(out, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._out,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def text(self) -> str:
        return self.out_path.read_bytes().decode(errors="replace")

    def wait_for(self, words: str, timeout_s: float = 30) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.text()
            if words in text:
                return text
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no {words!r} from the collector in {timeout_s} s:\n"
                             f"{self.text()[-3000:]}")

    def started(self) -> CollectorProcess:
        self.wait_for("collecting on")
        return self

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def rss_mib(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait()
        self._out.close()
        return code


def until(predicate, timeout_s: float = 15, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def read_json(path: Path):
    return json.loads(path.read_text())
