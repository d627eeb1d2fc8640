"""Real certificates for the TLS tests, made once per session with the `openssl` CLI: a
CA, the collector's certificate (for loopback and the network-namespace hub), a node's
client certificate, and a second CA nobody here trusts (with its own client)."""

from __future__ import annotations

import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

NAMES = "DNS:localhost,IP:127.0.0.1,IP:10.77.0.254"  # tests/netns.py's HUB_ADDRESS


@dataclass(frozen=True)
class Certs:
    ca: Path
    server: Path
    server_key: Path
    client: Path
    client_key: Path
    other_ca: Path  # a CA that signed none of the above
    other_client: Path  # signed by other_ca
    other_client_key: Path

    def server_env(self, require_clients: bool = False) -> dict[str, str]:
        env = {"DISTDOCTOR_TLS_CERT": str(self.server), "DISTDOCTOR_TLS_KEY": str(self.server_key)}
        return {**env, "DISTDOCTOR_TLS_CA": str(self.ca)} if require_clients else env

    def client_for(self, host: str) -> dict[str, str]:
        """A node's env with a client certificate of its own, naming `host` (with client
        certificates the collector takes a node's HELLO host only from a certificate
        that names it)."""
        d = self.ca.parent
        if not (d / f"client-{host}.pem").exists():
            _leaf(d, f"client-{host}", "ca", f"DNS:{host}")
        return {"DISTDOCTOR_TLS_CA": str(self.ca),
                "DISTDOCTOR_TLS_CERT": str(d / f"client-{host}.pem"),
                "DISTDOCTOR_TLS_KEY": str(d / f"client-{host}.key")}

    def node_env(self, client_cert: bool = False, ca: Path | None = None) -> dict[str, str]:
        env = {"DISTDOCTOR_TLS_CA": str(ca or self.ca)}
        if client_cert:
            env.update(DISTDOCTOR_TLS_CERT=str(self.client),
                       DISTDOCTOR_TLS_KEY=str(self.client_key))
        return env


def _openssl(*args: str, cwd: Path) -> None:
    out = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
             "-subj", f"/CN=distdoctor test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def _leaf(d: Path, name: str, ca: str, names: str | None = None) -> None:
    ext = d / f"{name}.ext"
    ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                   "extendedKeyUsage=serverAuth,clientAuth\nsubjectKeyIdentifier=hash\n"
                   "authorityKeyIdentifier=keyid,issuer\n"
                   + (f"subjectAltName={names}\n" if names else ""))
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", ext.name,
             cwd=d)


def make(d: Path) -> Certs:
    if shutil.which("openssl") is None:
        pytest.fail("the openssl CLI is needed to make the TLS tests' certificates")
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca")
    _ca(d, "other-ca")
    _leaf(d, "collector", "ca", NAMES)
    _leaf(d, "node", "ca", f"DNS:{socket.gethostname()}")  # the name its HELLO gives
    _leaf(d, "stranger", "other-ca")
    return Certs(d / "ca.pem", d / "collector.pem", d / "collector.key", d / "node.pem",
                 d / "node.key", d / "other-ca.pem", d / "stranger.pem", d / "stranger.key")
