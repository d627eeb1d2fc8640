"""The forwarder's socket to a collector (forward.py), every read and write within a
deadline: a collector that accepts and then reads or answers one byte at a time, or never,
holds a node's forwarder (and `run` at its end) no longer than that deadline. A socket's
own timeout is per call: a byte every few seconds renews it without end (and TLS's
sendall is such calls), so each call here gets what is left of the deadline."""

from __future__ import annotations

import socket
import ssl
import time


def _left(sock: socket.socket, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    sock.settimeout(left)


def recv_exactly(sock: socket.socket, n: int, deadline: float) -> bytes:
    """`n` bytes, fewer only where the stream ended; TimeoutError past `deadline`
    (time.monotonic()'s)."""
    got = bytearray()
    while len(got) < n:
        _left(sock, deadline)
        chunk = sock.recv(n - len(got))
        if not chunk:
            break
        got += chunk
    return bytes(got)


def reader(sock: socket.socket, deadline: float):
    """recv_exactly on `sock` by `deadline`, as wire.read_frame calls it."""
    return lambda n: recv_exactly(sock, n, deadline)


def send_within(sock: socket.socket, data: bytes, deadline: float) -> None:
    """All of `data`, or TimeoutError past `deadline`."""
    with memoryview(data) as view:
        sent = 0
        while sent < len(view):
            _left(sock, deadline)
            sent += sock.send(view[sent:])


def tls_why(exc: BaseException, shaken: bool = False) -> str:
    """A failed TLS connection, in words; `shaken`: after this side's handshake, when a
    TLS 1.3 server judges the client's certificate."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (f"its TLS certificate failed verification ({exc.verify_message}; is "
                f"DISTDOCTOR_TLS_CA the CA that signed it, for this address?)")
    reason = getattr(exc, "reason", None)
    if reason == "TLSV13_ALERT_CERTIFICATE_REQUIRED":
        return "it requires a client certificate (DISTDOCTOR_TLS_CERT, DISTDOCTOR_TLS_KEY)"
    if reason in ("TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE") or shaken and (
            reason == "UNEXPECTED_EOF_WHILE_READING" or isinstance(exc, ssl.SSLEOFError)):
        return ("it did not accept this node's client certificate, or wants one "
                "(DISTDOCTOR_TLS_CERT, DISTDOCTOR_TLS_KEY, signed by its DISTDOCTOR_TLS_CA)")
    if reason in ("WRONG_VERSION_NUMBER", "UNEXPECTED_EOF_WHILE_READING") or isinstance(
            exc, ssl.SSLEOFError):
        return "no TLS handshake (does it speak TLS? DISTDOCTOR_TLS_CERT on the collector)"
    text = (reason or str(exc) or type(exc).__name__).replace("_", " ").lower()
    return f"TLS failed ({text})"


def where(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
