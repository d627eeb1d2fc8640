"""A node's forwarder (`distdoctor run --forward`) against a collector that accepts and then
answers one byte at a time: a real slow server on loopback and a real `distdoctor run`.
The forwarder must not be held by it (every read and write within a deadline, one line
said, tried again), nor hold `run` at its end."""

from __future__ import annotations

import socket
import sys
import threading
import time

import pytest
from conftest import Lines, start_cli, stop_process

from distdoctor.collect import wire


class TrickleCollector:
    """Accepts, reads the node's HELLO, then answers with a WELCOME frame whose payload
    comes one byte every `every_s` (never the whole of it while the test runs)."""

    def __init__(self, every_s: float = 0.5):
        self.every_s = every_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> TrickleCollector:
        self.listener.settimeout(0.2)
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            t = threading.Thread(target=self._trickle, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                wire.read_frame(conn.makefile("rb").read, wire.MAX_HELLO)  # its HELLO
                answer = wire.json_frame(wire.WELCOME, {"sources": 1, "pad": "x" * 200})
                for i in range(len(answer)):
                    if self._stop.wait(self.every_s):
                        return
                    conn.sendall(answer[i:i + 1])
            except (OSError, wire.WireError):
                return

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.listener.close()
        for t in self._threads:
            t.join(timeout=5)


@pytest.mark.timeout(60)
def test_a_collector_answering_a_byte_at_a_time_holds_neither_the_forwarder_nor_run(
        tmp_path):
    """Before, the forwarder waited on the collector's answer for as long as bytes came
    (each read within 5 s, the answer never): silent, never trying again, and `run` waited
    10 s at its end for it. Now the answer is due whole within SEND_TIMEOUT_S: one line,
    a new attempt, and `run` ends with its job."""
    job_s = 6.5
    with TrickleCollector() as slow:
        start = time.monotonic()
        proc = start_cli(["run", "--run-dir", str(tmp_path / "run"), "--forward",
                          f"127.0.0.1:{slow.port}", "--", sys.executable, "-c",
                          f"import time; time.sleep({job_s})"])
        said = Lines(proc)
        try:
            code = proc.wait(40)
        finally:
            stop_process(proc)
        took = time.monotonic() - start
        connections = slow.connections
    text = "".join(said.lines)
    assert code == 0, text
    slow_lines = [line for line in said.lines if "did not answer" in line]
    assert len(slow_lines) == 1 and "127.0.0.1" in slow_lines[0], text
    assert connections >= 2, text  # it tried again
    assert took < job_s + 6, f"run took {took:.1f} s for a {job_s} s job:\n{text}"
    assert "Traceback" not in text


def test_while_no_digest_is_taken_the_oldest_arrivals_go_for_the_newest(monkeypatch):
    """A collector slow or away takes no digest: the node's builder holds at most
    MAX_ARRIVALS collectives (1,000 here, to stay quick), and past it the oldest go.
    Before, the newest were dropped: the digest sent at reconnection reported the
    collectives of long ago and none of those the ranks are in now."""
    from distdoctor.collect import digest
    from distdoctor.diagnosis.engine.core import Engine
    from distdoctor.runlog.reader import Event

    monkeypatch.setattr(digest, "MAX_ARRIVALS", 1000)

    def op(seq: int) -> Event:
        return Event(rank=0, index=seq, kind="collective", op="all_reduce",
                     status="in_flight", group="0", group_desc="default_pg",
                     group_ranks=(0, 1), seq=seq, peer=None, shapes=((64,),),
                     dtypes=("float32",), device="cpu", numel_in=64, numel_out=64,
                     reduce_op="sum", callsite=None, t_enter_ns=seq, t_end_ns=None,
                     span_index=0, name=None, error=None, is_async=False,
                     other_thread=False)

    builder = digest.DigestBuilder()
    builder.feed([op(seq) for seq in range(5000)])
    runs = builder.take(Engine(), 0.0, "node")["arrivals"]
    assert len(builder._arrivals) == 0 and builder.dropped == 4000
    assert [(r[1], r[4]) for r in runs] == [(4000, 1000)]  # seqs 4000-4999
