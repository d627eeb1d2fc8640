"""TLS for every endpoint distdoctor opens on the network: the collector's stream (`watch
--listen`), each node's forwarder (`run --forward`) and `/metrics`. One setting, the same
way everywhere; a flag of the command wins over the environment:

    DISTDOCTOR_TLS_CERT  a server's certificate (collector, /metrics), or a node's client
                         certificate (PEM; the key may be in the same file)
    DISTDOCTOR_TLS_KEY   its private key (PEM, not encrypted)
    DISTDOCTOR_TLS_CA    on a node: the CA its collector's certificate must be signed by;
                         on a server: client certificates signed by it are required

Python's `ssl` does all of it (TLS 1.2 at least, the host name checked on a node). A
setting that cannot be used (a missing file, a key that does not match its certificate)
is one UserError line, found before anything is bound or written.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

from distdoctor.errors import UserError

CERT, KEY, CA = "DISTDOCTOR_TLS_CERT", "DISTDOCTOR_TLS_KEY", "DISTDOCTOR_TLS_CA"
HANDSHAKE_S = 10.0  # a peer that does not finish its handshake in this long is dropped


@dataclass(frozen=True)
class TLSSettings:
    cert: str | None = None
    key: str | None = None
    ca: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.cert or self.key or self.ca)

    def server_words(self) -> str:
        """How a listener with these settings takes its peers, for its start line."""
        if not self.enabled:
            return "in clear"
        return "over TLS, client certificates required" if self.ca else "over TLS"

    def server_context(self, what: str) -> ssl.SSLContext | None:
        """For a listener (`what`: the command, for the error line); None without TLS."""
        if not self.enabled:
            return None
        if not self.cert:
            raise UserError(f"{what}: TLS ({_set(self)}) needs the server's certificate and "
                            f"key too: set {CERT} and {KEY}", 2)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load_chain(ctx, what)
        if self.ca:
            self._load_ca(ctx, what)
            ctx.verify_mode = ssl.CERT_REQUIRED  # a client without a certificate: refused
        return ctx

    def client_context(self, what: str) -> ssl.SSLContext | None:
        """For a node's forwarder: the collector's certificate is verified (against
        DISTDOCTOR_TLS_CA, else the system's CAs) and must name the address dialled."""
        if not self.enabled:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.ca:
            self._load_ca(ctx, what)
        if self.cert:
            self._load_chain(ctx, what)
        elif self.key:
            raise UserError(f"{what}: {KEY} is set without {CERT}", 2)
        return ctx

    def _load_chain(self, ctx: ssl.SSLContext, what: str) -> None:
        _readable(self.cert, CERT, what)
        if self.key:
            _readable(self.key, KEY, what)
        try:  # a password callback: an encrypted key fails here, never prompts
            ctx.load_cert_chain(self.cert, self.key or None, password=lambda: b"")
        except ssl.SSLError as exc:
            raise UserError(f"{what}: cannot use the TLS certificate {self.cert} with the key "
                            f"{self.key or '(in the same file)'}: {_why(exc)}", 2) from None

    def _load_ca(self, ctx: ssl.SSLContext, what: str) -> None:
        _readable(self.ca, CA, what)
        try:
            ctx.load_verify_locations(cafile=self.ca)
        except (ssl.SSLError, ValueError) as exc:
            raise UserError(f"{what}: {CA} {self.ca} holds no usable CA certificate: "
                            f"{_why(exc)}", 2) from None


def settings(cert: str | None = None, key: str | None = None, ca: str | None = None,
             env=None) -> TLSSettings:
    """The command's flags, else the environment's DISTDOCTOR_TLS_*."""
    env = os.environ if env is None else env
    return TLSSettings(cert or env.get(CERT) or None, key or env.get(KEY) or None,
                       ca or env.get(CA) or None)


def handshake(conn: ssl.SSLSocket, timeout_s: float = HANDSHAKE_S) -> None:
    """A server's side of an accepted connection, on the connection's own thread."""
    conn.settimeout(timeout_s)
    conn.do_handshake()


def failure(exc: BaseException) -> str:
    """A failed handshake, in words."""
    reason = getattr(exc, "reason", None) or ""
    if reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNEXPECTED_EOF_WHILE_READING"
                  ) or isinstance(exc, ssl.SSLEOFError):
        return "no TLS handshake (a plaintext peer? set DISTDOCTOR_TLS_CA on it)"
    if reason in ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "TLSV13_ALERT_CERTIFICATE_REQUIRED"):
        return "no client certificate (DISTDOCTOR_TLS_CERT and DISTDOCTOR_TLS_KEY on it)"
    if isinstance(exc, TimeoutError):
        return f"no TLS handshake within {HANDSHAKE_S:g} s"
    return f"TLS handshake failed: {_why(exc)}"


def _why(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return exc.verify_message or str(exc)
    reason = getattr(exc, "reason", None)
    if reason == "KEY_VALUES_MISMATCH":
        return "the key does not match the certificate"
    return (reason or str(exc) or type(exc).__name__).replace("_", " ").lower()


def _readable(path: str, name: str, what: str) -> None:
    if not os.path.isfile(path):
        raise UserError(f"{what}: {name}: no such file: {path}", 2)
    if not os.access(path, os.R_OK):
        raise UserError(f"{what}: {name}: cannot read {path}", 2)


def _set(s: TLSSettings) -> str:
    return ", ".join(n for n, v in ((CERT, s.cert), (KEY, s.key), (CA, s.ca)) if v)
