"""A node's side of multi-node collection: `distdoctor run --forward HOST:PORT` ships this
node's run dir (its ranks' event logs, metadata, probe samples and exit codes) to the
collector, which keeps a copy that `watch` and `diagnose` read like a local run dir.

It runs in `distdoctor run`'s process, never in a rank: the ranks write their logs as
always and the forwarder reads them the way the live engine does. The logs are the buffer:
nothing is queued in memory, so a collector that is down or slow costs the job nothing;
after a reconnect each log is sent again from its newest MIRROR_SLOTS events. Here: the
pass, finding the logs, the connection and its retries; log_source.py: what one log sends.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import ssl
import sys
import threading
import time
from pathlib import Path

from distdoctor.collect import auth, wire
from distdoctor.collect.log_source import LogSource
from distdoctor.collect.node_socket import reader, send_within, tls_why, where
from distdoctor.collect.source_copies import SourceSender
from distdoctor.errors import UserError
from distdoctor.privatefiles import read_bounded
from distdoctor.runlog.rundir import MAX_RANK_META_BYTES, rank_logs, rank_meta_path, ring_path
from distdoctor.safetext import printable

INTERVAL_S = 0.25
DIGEST_INTERVAL_S = 0.5  # a digest is each rank's position: half as often as logs go
# The collector goes through every rank's position in each round of digests (~7 us a rank:
# 100,000 ranks twice a second took 1.5 of its cores). Past this many ranks in the job,
# a node sends once a second: the collector stays within a core at 100,000 ranks, and
# hangs are still decided in seconds (a node is lost after LOST_S, late after 6 s).
DIGEST_SLOWER_PAST = 50_000
DIGEST_SLOWER_S = 1.0
RETRY_S = (0.5, 1, 2, 5, 10, 30)  # waits between connection attempts; the last repeats
STABLE_S = 30.0  # a connection that lasted this long resets the waits and the messages
SEND_TIMEOUT_S = 5.0  # a connection attempt (with the collector's answer), or a frame
PASS_S = 3 * SEND_TIMEOUT_S  # one pass's frames: past it the collector is too slow
STOP_WAIT_S = 1.0  # at the end, a pass in flight that sent no frame this long is cut


class Forwarder:
    def __init__(self, run_dir: str | os.PathLike, address: tuple[str, int],
                 token: str | None = None, run_meta: dict | None = None, live=None,
                 tls: ssl.SSLContext | None = None):
        """`token`: answers the collector's challenge (auth.py), never sent itself;
        `live`: the node's LiveDiagnosis, to send digests of (collect/digest.py)
        instead of the logs themselves; `tls`: the client context (collect/tls.py), the
        stream then encrypted from its first byte (the token goes inside it)."""
        self.tls = tls
        self.run_dir = Path(run_dir)
        self.address = address
        self.token = token
        self.run_meta = run_meta or {}
        self.host = socket.gethostname()
        self.instance = secrets.token_hex(8)  # this forwarder: its reconnections replace
        self.live = live
        self.digest = None
        if live is not None:
            from distdoctor.collect.digest import DigestBuilder

            self.digest = DigestBuilder()
            live.on_batch = self._feed_digest
        self.sources: dict[tuple[int, int], LogSource] = {}  # (rank, log number) -> source
        self.done: set[tuple[int, int]] = set()  # logs sent whole and let go
        self._sock: socket.socket | None = None
        self._talking: socket.socket | None = None  # the socket a pass uses now
        self._deadline = float("inf")  # the pass's (monotonic): every read and write by it
        self._timed_out = False  # the last attempt got no answer in time
        self._connected_s = 0.0
        self._next_try_s = 0.0
        self._failures = 0  # attempts since the last connection that lasted STABLE_S
        self._refused_by: str | None = None  # the collector's last refusal, until welcomed
        self._said: set[str] = set()
        self._quiet = False  # (stop() cuts a pass in flight)
        self._samples = None
        self._findings_seen: int | None = None  # findings.json's mtime, last read
        self._findings_sent: bytes | None = None
        self.kept = SourceSender(self.run_dir)  # the run's sources/, to a collector that
        self._sources_welcome = False           # says it takes them (WELCOME)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="distdoctor-forward",
                                        daemon=True)
        self.sent_bytes = 0

    def start(self) -> Forwarder:
        self._thread.start()
        return self

    def stop(self, exits: list[dict] | None = None) -> None:
        """A last pass (the final events and heartbeats), then the exit codes. Never
        raises: `distdoctor run` still writes its summary and exits with the job's code."""
        self._stop.set()
        if self._thread.ident is not None:  # a pass in flight goes on while it sends frames
            sent, end = -1, time.monotonic() + 2 * SEND_TIMEOUT_S
            while self._thread.is_alive() and sent != self.sent_bytes and time.monotonic() < end:
                sent = self.sent_bytes
                self._thread.join(timeout=STOP_WAIT_S)
            if self._thread.is_alive() and self._talking is not None:  # a slow collector:
                self._quiet = True  # its read or write ends now (how it fails: no news)
                with contextlib.suppress(OSError):
                    self._talking.shutdown(socket.SHUT_RDWR)
                self._thread.join(timeout=STOP_WAIT_S)
                self._quiet = False
        try:
            if not self._thread.is_alive():  # never two writers on one socket
                self.tick(final=True)
                if exits and self._sock is not None:
                    self._send(wire.json_frame(wire.EXITS, {"processes": exits}))
        except OSError as exc:
            self._say("final", f"the collector at {where(self.address)} missed the job's "
                      f"last events ({exc.strerror or exc})")
        except Exception as exc:
            self._say("bug", f"forwarding stopped: {exc!r}")
        finally:
            if self._sock is not None:
                self._sock.close()
            if not self._thread.is_alive():
                for src in self.sources.values():
                    src.close()

    def _loop(self) -> None:
        while not self._stop.wait(INTERVAL_S if self.digest is None
                                  else self.digest_interval_s()):
            try:
                self.tick()
            except OSError as exc:
                self._lost(exc)
            except Exception as exc:  # never take `distdoctor run` (and the job) down
                self._say("bug", f"forwarding stopped: {exc!r}")
                return

    def digest_interval_s(self) -> float:
        """How often this node sends its digest: by the job's world size, as its ranks'
        logs say it (0.5 s until one does)."""
        world = max((src.log.launch.get("world", 0) for src in list(self.sources.values())
                     if isinstance(src.log.launch, dict)
                     and isinstance(src.log.launch.get("world"), int)), default=0)
        return DIGEST_SLOWER_S if world > DIGEST_SLOWER_PAST else DIGEST_INTERVAL_S

    # --- one pass ------------------------------------------------------------------
    def tick(self, final: bool = False) -> None:
        """One pass: every frame sent within PASS_S (TimeoutError past it)."""
        self._deadline = time.monotonic() + PASS_S
        self._discover()
        if self._sock is None and not self._connect(final):
            return
        self._talking = self._sock
        if self._failures and time.monotonic() - self._connected_s > STABLE_S:
            self._failures = 0
            self._said.clear()  # news again from now on
        if self.digest is not None:
            return self._forward_digest()
        for key, src in list(self.sources.items()):
            try:
                self._forward_log(src)
            except UserError as exc:  # rewritten by something else: say so, send the rest
                self._say(f"log {key}", str(exc))
                self._let_go(key)
                continue
            superseded = any(r == key[0] and n > key[1] for r, n in self.sources)
            if src.finished(superseded):
                self._let_go(key)
        self._forward_samples()
        self._forward_findings()
        self._forward_sources()

    def _feed_digest(self, events) -> None:
        # under the live engine's lock, on its thread: only collected here
        self.digest.feed(events)

    def _forward_digest(self) -> None:
        """Metadata as it changes, then the digest of the node's ranks."""
        for src in self.sources.values():
            self._forward_meta(src)
        with self.live._lock:
            payload = self.digest.take(self.live.engine, time.monotonic(), self.host)
        data = json.dumps(payload, separators=(",", ":")).encode()
        if len(data) > wire.MAX_PAYLOAD:  # a backlog after a stall: positions only
            payload["arrivals"], payload["sigs"] = [], {}
            data = json.dumps(payload, separators=(",", ":")).encode()
        self._send(wire.frame(wire.DIGEST, data))
        self._forward_samples()
        self._forward_findings()
        self._forward_sources()

    def _let_go(self, key: tuple[int, int]) -> None:
        self.sources.pop(key).close()
        self.done.add(key)

    def _discover(self) -> None:
        """New logs: a rank's first, or its next one when it started again."""
        for rank, numbers in rank_logs(self.run_dir).items():
            for number in numbers:
                key = (rank, number)
                if key in self.sources or key in self.done:
                    continue
                if number > wire.MAX_LOG:
                    self._say("max log", f"rank {rank} started more than {wire.MAX_LOG} "
                              f"times; its later logs are not forwarded")
                    continue
                try:
                    self.sources[key] = LogSource(ring_path(self.run_dir, rank, number),
                                                rank, number)
                except UserError:
                    continue  # unreadable: tried again next pass

    def _connect(self, final: bool) -> bool:
        now = time.monotonic()
        if now < self._next_try_s and (not final or self._refused_by or self._timed_out):
            return False  # (one that refused this node or did not answer: not at the end)
        try:
            sock = socket.create_connection(
                self.address, timeout=max(0.01, min(SEND_TIMEOUT_S, self._deadline - now)))
        except OSError as exc:
            self._back_off()
            self._say("connect", f"cannot reach the collector at {where(self.address)} "
                      f"({exc.strerror or exc}); the job goes on, retrying")
            return False
        if self.tls is not None:
            try:  # the handshake, within SEND_TIMEOUT_S
                sock = self.tls.wrap_socket(sock, server_hostname=self.address[0])
            except ssl.SSLError as exc:  # its certificate, or no TLS there
                sock.close()
                return self._refused(tls_why(exc))
            except OSError as exc:  # slow, or gone: tried again soon
                sock.close()
                self._back_off()
                self._say("connect", f"the collector at {where(self.address)} did not "
                          f"finish a TLS handshake ({exc.strerror or exc}); the job goes "
                          f"on, retrying")
                return False
        self._talking = sock
        try:  # HELLO and the answer, whole within SEND_TIMEOUT_S (however it trickles)
            verdict = self._introduce(sock, min(self._deadline, now + SEND_TIMEOUT_S))
        except ssl.SSLError as exc:  # TLS 1.3: a client certificate is judged after
            sock.close()
            return self._refused(tls_why(exc, shaken=True))
        except (wire.WireError, ConnectionResetError) as exc:  # not an answer of ours
            sock.close()
            hint = "" if self.tls is not None else "; does it require TLS? (DISTDOCTOR_TLS_CA)"
            return self._refused(f"it did not answer as a collector ({exc}){hint}")
        except OSError as exc:
            sock.close()
            self._back_off()
            self._timed_out = isinstance(exc, TimeoutError)
            hint = "" if self.tls is not None else "; does it require TLS? (DISTDOCTOR_TLS_CA)"
            why = (f"within {SEND_TIMEOUT_S:g} s, or answers too slowly" if self._timed_out
                   else f"({exc}){hint}")
            self._say("connect", f"the collector at {where(self.address)} did not answer "
                      f"{why}; the job goes on, retrying")
            return False
        if verdict is None or verdict[0] != wire.WELCOME:
            sock.close()
            why = "closed the connection"
            if self.tls is None:
                why += " (does it require TLS? set DISTDOCTOR_TLS_CA)"
            elif verdict is None:
                why = tls_why(ssl.SSLEOFError(), shaken=True)
            if verdict is not None and verdict[0] == wire.REFUSED:
                try:
                    why = printable(wire.json_payload(wire.REFUSED, verdict[3]).get("why"),
                                    200)  # the collector's words, never terminal control
                except wire.WireError as exc:
                    why = str(exc)
            return self._refused(why)
        self._sock, self._connected_s, self._refused_by = sock, now, None
        self._timed_out = False
        self._findings_sent = None
        self.kept.reset()
        try:
            self._sources_welcome = bool(verdict[3]) and wire.json_payload(
                wire.WELCOME, verdict[3]).get("sources") == 1
        except wire.WireError:
            self._sources_welcome = False
        for src in self.sources.values():
            src.reset()
            src.meta_mtime = None
        if self.digest is not None:
            with self.live._lock:
                self.digest.reset()
        over = " over TLS" if self.tls is not None else ""
        self._say("connected", f"forwarding to the collector at {where(self.address)}{over}")
        return True

    def _introduce(self, sock: socket.socket, deadline: float) -> tuple | None:
        """HELLO, then the answer to the collector's challenge when it sends one (it has
        a token: the token itself never goes out, only an HMAC of the nonce); the
        collector's verdict, WELCOME or REFUSED. All of it by `deadline`."""
        send_within(sock, wire.json_frame(wire.HELLO, {
            "format": wire.FORMAT, "version": wire.VERSION, "host": self.host,
            "instance": self.instance, "run": self.run_meta}), deadline)
        read = reader(sock, deadline)
        got = wire.read_frame(read, wire.MAX_HELLO)
        if got is not None and got[0] == wire.CHALLENGE:
            answer = auth.answer(self.token, got[3], self.host) if self.token else None
            send_within(sock, wire.json_frame(wire.AUTH, {"answer": answer}), deadline)
            got = wire.read_frame(read, wire.MAX_HELLO)
        return got

    def _refused(self, why: str) -> bool:
        self._refused_by = why
        self._back_off(RETRY_S[-1])
        self._say("refused", f"the collector at {where(self.address)} refused this "
                  f"node: {why}; the job goes on")
        return False

    def _back_off(self, at_least_s: float = 0.0) -> None:
        self._failures += 1
        wait = RETRY_S[min(self._failures, len(RETRY_S)) - 1]
        self._next_try_s = time.monotonic() + max(wait, at_least_s)

    def _lost(self, exc: OSError) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._back_off()
        self._say("lost", f"lost the collector at {where(self.address)} "
                  f"({exc.strerror or exc}); the job goes on, reconnecting")
        self._said.update(("connect", "refused"))  # the retries are that same news

    def _send(self, data: bytes) -> None:
        """A frame, within SEND_TIMEOUT_S and the pass's deadline: a collector that reads
        slower loses the connection (and what is queued on it); the next starts afresh."""
        send_within(self._sock, data, min(self._deadline, time.monotonic() + SEND_TIMEOUT_S))
        self.sent_bytes += len(data)

    def _forward_log(self, src: LogSource) -> None:
        self._forward_meta(src)
        src.forward(self._send)

    def _forward_meta(self, src: LogSource) -> None:
        path = rank_meta_path(self.run_dir, src.rank, src.number)
        try:
            mtime = os.stat(path).st_mtime_ns
            if mtime == src.meta_mtime:
                return
            data = read_bounded(path, MAX_RANK_META_BYTES)  # (a FIFO there: refused)
            wire.json_payload(wire.META, data)  # half written: next pass
        except (OSError, wire.WireError):
            return
        self._send(wire.frame(wire.META, data, src.rank, log=src.number))
        src.meta_mtime = mtime

    def _forward_samples(self) -> None:
        from distdoctor.probes.sampler import SampleTail

        if self._samples is None:
            self._samples = SampleTail(self.run_dir)
        samples = self._samples.read_new()
        if samples:
            data = "".join(json.dumps(s.to_json()) + "\n" for s in samples).encode()
            if len(data) > wire.MAX_PAYLOAD:  # only after a long disconnection: the newest
                data = data[-wire.MAX_PAYLOAD:]
                data = data[data.find(b"\n") + 1:]
            self._send(wire.frame(wire.SAMPLES, data))

    def _forward_findings(self) -> None:
        """The errors `run` read from this node's job output: only this node has them.
        With digests also the node's stragglers: its engine completes the collectives of
        the groups wholly on the node, and no others (collect/digest.py)."""
        from distdoctor.findings import FINDINGS_FILE, read_findings

        try:
            mtime = os.stat(self.run_dir / FINDINGS_FILE).st_mtime_ns
            if mtime == self._findings_seen and self._findings_sent is not None:
                return
            found = read_findings(self.run_dir)
        except (OSError, ValueError):
            return
        self._findings_seen = mtime
        own = wire.NODE_KINDS if self.digest is not None else ()
        payload = json.dumps({"findings": [f.to_json() for f in found
                                           if f.details.get("source") == "log"
                                           or f.kind in own][:100]})
        data = payload.encode()[:wire.MAX_PAYLOAD]
        if data != self._findings_sent:
            self._send(wire.frame(wire.FINDINGS, data))
            self._findings_sent = data

    def _forward_sources(self) -> None:
        if self._sources_welcome:
            said = self.kept.forward(self._send)
            if said:
                self._say("sources", said)

    def _say(self, key: str, message: str) -> None:
        """One line per kind of news until a connection has lasted STABLE_S: a collector
        that refuses or drops this node is not reported on every retry."""
        if key in self._said or self._quiet:
            return
        self._said.add(key)
        print(f"distdoctor: {printable(message, 1000)}", file=sys.stderr)
