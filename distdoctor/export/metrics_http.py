"""The `/metrics` endpoint: a small threaded HTTP server over export/metrics.py.

Binds loopback unless told otherwise; any other address needs DISTDOCTOR_TOKEN, which a
scraper then sends as `Authorization: Bearer TOKEN` (Prometheus: `authorization:
{credentials: TOKEN}` in the scrape config). With DISTDOCTOR_TLS_CERT and _KEY it answers
https only (and with DISTDOCTOR_TLS_CA, only to scrapers with a client certificate signed
by that CA: collect/tls.py); each handshake is done on its request's thread. A scrape runs on the server's own thread, at
low priority: the live engine's lock is held only while numbers are copied out.
"""

from __future__ import annotations

import hmac
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from distdoctor.errors import UserError
from distdoctor.export.metrics import gather, job_label, render

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.server.owner.answer(self)

    def log_message(self, *args):  # a scrape every few seconds must not fill stderr
        pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    tls: ssl.SSLContext | None = None

    def get_request(self):
        conn, peer = super().get_request()
        if self.tls is not None:  # no handshake here: a slow peer must not hold the rest
            conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, peer

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
