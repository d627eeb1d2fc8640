"""A simulated node and a real collector process, for the collector's security tests.

`connect_node` is the one place that speaks the forwarding handshake (HELLO, then the
answer to the collector's CHALLENGE when it has a token), so the tests stay independent
of how nodes prove who they are. The collector is `python -m distdoctor watch --listen`,
a real process on loopback, with its output in a file and a hard stop."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
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


def hello(host: str, instance: str | None = None) -> bytes:
    """A node's HELLO frame, naming `host` (and `instance`, the host's by default)."""
    return wire.json_frame(wire.HELLO, {"format": wire.FORMAT, "version": wire.VERSION,
                                        "host": host, "instance": instance or host,
                                        "run": {}})


def reply(sock: socket.socket):
    """The collector's next frame on a handshake, None when it closed or sent garbage."""
    try:
        return wire.read_frame(sock.makefile("rb").read, wire.MAX_HELLO)
    except (OSError, wire.WireError):
        return None


def joins_answering_late(address, token: str, delay_s: float, source: str = "127.0.0.1",
                         host: str = "real") -> bool:
    """A new node from `source` that answers its challenge `delay_s` after it came (a
    node a network away): whether it was welcomed."""
    from distdoctor.collect import auth

    with socket.create_connection(address, timeout=8, source_address=(source, 0)) as s:
        s.settimeout(8)
        s.sendall(hello(host))
        got = reply(s)
        if got is not None and got[0] == wire.CHALLENGE:
            time.sleep(delay_s)
            s.sendall(wire.json_frame(wire.AUTH, {"answer": auth.answer(token, got[3],
                                                                         host)}))
            got = reply(s)
        return got is not None and got[0] == wire.WELCOME


class HelloFlood:
    """`n` connections at a time, each saying HELLO and then nothing (never idle, never
    answering its challenge), reopened as the collector closes them, in a thread: at most
    `budget` in all. `sources`: how many loopback addresses they come from, 127.0.0.2 on
    (what a defence keyed on one address does not see); none: all from 127.0.0.1."""

    def __init__(self, address, n: int, budget: int = 20_000, sources: int | None = None):
        self.address, self.n, self.budget, self.sources = address, n, budget, sources
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep_up, daemon=True)

    def __enter__(self) -> HelloFlood:
        self._thread.start()
        time.sleep(1.0)  # (the flood at full pressure before the node comes)
        return self

    def _source(self) -> str:
        return "127.0.0.1" if self.sources is None else f"127.0.0.{2 + self.opened % self.sources}"

    def _keep_up(self) -> None:
        socks: list[socket.socket] = []
        while not self._stop.is_set() and self.opened < self.budget:
            poller = select.poll()
            for s in socks:
                poller.register(s.fileno(), select.POLLIN)
            gone = {fd for fd, _ in poller.poll(0)}  # (a challenge, or the close)
            for s in [s for s in socks if s.fileno() in gone]:
                try:
                    alive = bool(s.recv(4096, socket.MSG_DONTWAIT))
                except OSError:
                    alive = False
                if not alive:
                    socks.remove(s)
                    s.close()
            while len(socks) < self.n and self.opened < self.budget:
                try:
                    s = socket.create_connection(self.address, timeout=2,
                                                 source_address=(self._source(), 0))
                    s.sendall(hello(f"flood{self.opened % 250}"))
                except OSError:
                    break
                socks.append(s)
                self.opened += 1
            time.sleep(0.005)
        for s in socks:
            s.close()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


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


def closed_ones(socks: list[socket.socket]) -> list[socket.socket]:
    """The idle sockets the collector has closed (readable: EOF or a reset); poll, not
    select: a flood's descriptors go past select's 1,024."""
    poller = select.poll()
    by_fd = {s.fileno(): s for s in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    return [by_fd[fd] for fd, _ in poller.poll(0)]


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


def head_of(path) -> int:
    """The head of the rank log at `path` (a copy's), -1 while it cannot be read."""
    from distdoctor.runlog.reader import RankLog

    try:
        log = RankLog(path)
    except Exception:
        return -1
    try:
        return log.header().head
    finally:
        log.close()
