"""The `/metrics` endpoint: a small threaded HTTP server over export/metrics.py.

Binds loopback unless told otherwise; any other address needs DISTDOCTOR_TOKEN, which a
scraper then sends as `Authorization: Bearer TOKEN` (Prometheus: `authorization:
{credentials: TOKEN}` in the scrape config). With DISTDOCTOR_TLS_CERT and _KEY it answers
https only (and with DISTDOCTOR_TLS_CA, only to scrapers with a client certificate signed
by that CA: collect/tls.py); each handshake is done on its request's thread. A scrape runs on the server's own thread, at
low priority: the live engine's lock is held only while numbers are copied out.

Scrapers must never starve the process they watch (`run`'s probes, the ranks' logs) of
file descriptors: connections are capped (MAX_SCRAPERS, fewer under a low `ulimit -n`;
past the cap the oldest connection that has not sent its request goes, so a real scrape
still gets in beside hundreds of idle sockets), a request not whole within REQUEST_S
(TLS handshake, request line, headers) is dropped (slowloris), and an accept that fails
for want of descriptors is said once and paused on, never spun on. The soft open-files
limit is not raised here: the job `run` starts would inherit it.
"""

from __future__ import annotations

import errno
import hmac
import socket
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from distdoctor.errors import UserError
from distdoctor.export.metrics import gather, job_label, render

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_SCRAPERS = 32  # connections at once (Prometheus keeps one per target; more is a flood)
REQUEST_S = 5.0  # from accept to the whole request; a scrape sends it at once
OUT_OF_FILES_PAUSE_S = 0.25  # accept() failed for want of descriptors: wait, do not spin


def scraper_cap() -> int:
    """MAX_SCRAPERS, or a sixteenth of the soft open-files limit where that is less."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return MAX_SCRAPERS
    if soft == getattr(resource, "RLIM_INFINITY", -1) or soft <= 0:
        return MAX_SCRAPERS
    return max(4, min(MAX_SCRAPERS, soft // 16))


def _limit_words() -> str:
    try:
        import resource

        return f"ulimit -n {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}"
    except (ImportError, OSError, ValueError):
        return "the open-files limit"


class _Connections:
    """The open connections, oldest first, each with its accept time and whether it has
    sent its whole request. Touched by the serving thread and the request threads."""

    def __init__(self, cap: int):
        self.cap = cap
        self._lock = threading.Lock()
        self._open: dict[socket.socket, list] = {}  # insertion order: oldest first

    def admit(self, conn: socket.socket) -> bool:
        """Room for `conn`, made by dropping the oldest idle one if need be."""
        with self._lock:
            if len(self._open) >= self.cap and not self._drop_oldest_idle():
                return False  # every slot is answering a scrape: this one waits no turn
            self._open[conn] = [time.monotonic(), False]
            return True

    def answering(self, conn: socket.socket) -> None:
        with self._lock:
            if conn in self._open:
                self._open[conn][1] = True

    def closed(self, conn: socket.socket) -> None:
        with self._lock:
            self._open.pop(conn, None)

    def drop_overdue(self) -> None:
        deadline = time.monotonic() - REQUEST_S
        with self._lock:
            late = [c for c, (t, busy) in self._open.items() if not busy and t < deadline]
            for conn in late:
                self._drop(conn)

    def drop_oldest_idle(self) -> bool:
        with self._lock:
            return self._drop_oldest_idle()

    def drop_all(self) -> None:
        with self._lock:
            for conn in list(self._open):
                self._drop(conn)

    def _drop_oldest_idle(self) -> bool:
        for conn, (_, busy) in self._open.items():
            if not busy:
                self._drop(conn)
                return True
        return False

    def _drop(self, conn: socket.socket) -> None:
        """End `conn` under its thread's feet: its read returns nothing and it closes. The
        plain socket's shutdown, even under TLS: the SSL object stays its thread's."""
        self._open.pop(conn, None)
        try:
            socket.socket.shutdown(conn, socket.SHUT_RDWR)
        except OSError:
            pass


class _Handler(BaseHTTPRequestHandler):
    timeout = REQUEST_S  # each read and write; the whole request is bounded by _Connections

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.server.conns.answering(self.connection)
        self.server.owner.answer(self)

    def log_message(self, *args):  # a scrape every few seconds must not fill stderr
        pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a burst of connects waits in the kernel, not in our files
    tls: ssl.SSLContext | None = None
    conns: _Connections
    _said_out_of_files = False

    def get_request(self):
        try:
            conn, peer = super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self._out_of_files()
            raise  # socketserver drops this accept and goes on
        if self.tls is not None:  # no handshake here: a slow peer must not hold the rest
            conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, peer

    def _out_of_files(self) -> None:
        """The process is out of descriptors (the job's, not only ours): an idle scraper's
        goes, the line is said once, and the listener pauses instead of spinning."""
        self.conns.drop_oldest_idle()
        if not self._said_out_of_files:
            self._said_out_of_files = True
            print(f"distdoctor: --metrics: this process is out of file descriptors "
                  f"({_limit_words()}); scrapes are refused while it lasts: raise it "
                  f"(ulimit -n) before starting distdoctor", file=sys.stderr)
        time.sleep(OUT_OF_FILES_PAUSE_S)

    def process_request(self, request, client_address):
        if not self.conns.admit(request):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        self.conns.closed(request)
        super().shutdown_request(request)

    def service_actions(self):  # every turn of serve_forever (at most poll_interval apart)
        self.conns.drop_overdue()

    def handle_error(self, request, client_address):
        pass  # a peer that hung up or sent garbage: nothing to print, no traceback

    def finish_request(self, request, client_address):
        if isinstance(request, ssl.SSLSocket):
            from distdoctor.collect.tls import handshake

            try:  # a plaintext scraper, a missing client certificate: nothing in
                handshake(request)
            except (ssl.SSLError, OSError):
                return
            request.settimeout(None)
        super().finish_request(request, client_address)


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


class MetricsServer:
    """Bound at once (a port in use is found before anything is written); serving once
    `serve` gives it the live engine to read."""

    def __init__(self, address: tuple[str, int], token: str | None,
                 tls: ssl.SSLContext | None = None):
        self.live, self.token, self.job = None, token, ""
        self.scrapes = 0
        self.error: str | None = None  # the last scrape's failure, if any
        try:
            self.httpd = (_HTTPServer6 if ":" in address[0] else _HTTPServer)(address, _Handler)
        except OSError as exc:
            raise UserError(f"--metrics: cannot listen on {address[0]}:{address[1]}: "
                            f"{exc.strerror or exc}") from None
        self.httpd.owner = self
        self.httpd.tls = tls
        self.httpd.conns = _Connections(scraper_cap())
        self.address = self.httpd.server_address[:2]
        self._thread = threading.Thread(target=self._serve, name="distdoctor-metrics",
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self.address
        scheme = "https" if self.httpd.tls is not None else "http"
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def serve(self, live, job: str | None = None, fleet=None) -> MetricsServer:
        """`fleet`: the collector's engine over the nodes that send digests."""
        self.live, self.job, self.fleet = live, job or job_label(live.run_dir), fleet
        self._thread.start()
        return self

    def _serve(self) -> None:
        from distdoctor.priority import lower_this_thread

        lower_this_thread()
        self.httpd.serve_forever(poll_interval=0.5)

    def stop(self) -> None:
        if self._thread.is_alive():
            self.httpd.shutdown()
        self.httpd.conns.drop_all()  # server_close waits for the request threads
        self.httpd.server_close()

    def answer(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path.split("?", 1)[0]
        if path not in ("/metrics", "/"):
            return _reply(req, 404, b"not found: distdoctor serves /metrics\n")
        if self.token is not None:
            sent = req.headers.get("Authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {self.token}".encode()):
                return _reply(req, 401, b"a bearer token is required\n")
        if path == "/":
            return _reply(req, 200, b"distdoctor: metrics at /metrics\n")
        try:
            body = render(gather(self.live, self.job, fleet=self.fleet))
            self.scrapes += 1
        except Exception as exc:  # never take the launcher down; say it on the scrape
            self.error = repr(exc)
            return _reply(req, 500, f"distdoctor: metrics failed: {exc!r}\n".encode())
        _reply(req, 200, body, CONTENT_TYPE)


def _reply(req, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
    try:
        req.send_response(code)
        req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)
    except OSError:  # the scraper hung up
        pass


def bind_metrics(text: str, what: str, tls_settings=None) -> MetricsServer:
    """`--metrics HOST:PORT` of `what` (run, watch): checked and bound, not yet serving.
    `tls_settings`: the command's (collect/tls.py), else DISTDOCTOR_TLS_*."""
    import os
    import sys

    from distdoctor.collect import tls
    from distdoctor.collect.server import is_loopback, parse_address

    host, port = parse_address(text, f"{what} --metrics")
    token = os.environ.get("DISTDOCTOR_TOKEN") or None
    if not is_loopback(host) and token is None:
        raise UserError(f"{what}: --metrics on {host} (not loopback) needs a shared token: "
                        f"set DISTDOCTOR_TOKEN (scrapers send it as a bearer token)", 2)
    settings = tls.settings() if tls_settings is None else tls_settings
    ctx = settings.server_context(f"{what} --metrics")
    if ctx is None and not is_loopback(host):
        print(f"distdoctor: {what} --metrics: no TLS on {host}: the token and the metrics "
              f"travel in clear (set {tls.CERT} and {tls.KEY})", file=sys.stderr)
    return MetricsServer((host, port), token, ctx)
