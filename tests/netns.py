"""Nodes in network namespaces: real multi-node jobs on one machine (root only).

Each node is a network namespace with one link (a veth pair) to a hub namespace, where a
bridge joins the links and the collector listens: a star network like a rack's switch.
A node's processes get its own host name (`unshare --uts`) and a hosts file naming every
node (/etc/netns/NAME/hosts, which `ip netns exec` mounts over /etc/hosts), so torchrun's
rendezvous and the tracer's rank metadata see distinct hosts, as on real nodes.

What a test can then do to a node's link, for real: `limit` it (a `tc tbf` rate limit
on both of its ends: this kernel has no netem) or `cut` it (`ip link set ... down`).

Names carry the test process's pid and a counter, so tests in parallel never share a
namespace; everything (the namespaces' processes, links, hosts files) is removed when the
`cluster` context ends, also when the test fails; a later run removes what an aborted one
(its pid gone) left.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

PREFIX = "ddnet"  # every namespace these tests make: ddnet-PID-N-ROLE
NETNS_ETC = Path("/etc/netns")
NIC = "eth0"  # a node's side of its link, inside its namespace
SUBNET = "10.77.0"  # each test's namespaces are its own: addresses never meet another's
HUB_ADDRESS = f"{SUBNET}.254"
_counter = itertools.count()


def why_not() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing (iproute2 / util-linux)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _in(netns: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return _ip("netns", "exec", netns, *cmd, check=check)


@dataclass
class Node:
    label: str  # "a", "b", ...
    netns: str
    hostname: str
    address: str
    hub_port: str  # its link's other end, on the hub's bridge


class Cluster:
    """The hub (bridge, collector) and the nodes of one test."""

    def __init__(self, labels: list[str]):
        self.tag = f"{PREFIX}-{os.getpid()}-{next(_counter)}"
        self.hub = Node("hub", f"{self.tag}-hub", f"hub-{self.tag}", HUB_ADDRESS, "")
        self.nodes = {label: Node(label, f"{self.tag}-{label}", f"{label}-{self.tag}",
                                  f"{SUBNET}.{i + 1}", f"to-{label}")
                      for i, label in enumerate(labels)}

    def _every(self) -> list[Node]:
        return [self.hub, *self.nodes.values()]

    def build(self) -> None:
        hosts = "127.0.0.1 localhost\n" + "".join(
            f"{n.address} {n.hostname}\n" for n in self._every())
        for node in self._every():
            (NETNS_ETC / node.netns).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / node.netns / "hosts").write_text(hosts)
            _ip("netns", "add", node.netns)
            _ip("-n", node.netns, "link", "set", "lo", "up")
        hub = self.hub.netns
        _ip("-n", hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", hub, "addr", "add", f"{HUB_ADDRESS}/24", "dev", "br0")
        _ip("-n", hub, "link", "set", "br0", "up")
        for node in self.nodes.values():
            # made inside the namespaces: no name is ever taken in the machine's own
            _ip("link", "add", NIC, "netns", node.netns, "type", "veth", "peer", "name",
                node.hub_port, "netns", hub)
            _ip("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", NIC)
            _ip("-n", node.netns, "link", "set", NIC, "up")
            _ip("-n", hub, "link", "set", node.hub_port, "master", "br0")
            _ip("-n", hub, "link", "set", node.hub_port, "up")

    def start(self, node: Node, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        """`cmd` on `node` (its namespace, its host name), in a session of its own."""
        named = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"',
                 node.hostname]
        return subprocess.Popen(["ip", "netns", "exec", node.netns, *named, *cmd],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))

    def limit(self, node: Node, rate: str = "50mbit") -> None:
        """A slow link: a token bucket on both ends of the node's link (each shapes what
        leaves through it), so the node sends and receives at `rate`."""
        for netns, dev in ((node.netns, NIC), (self.hub.netns, node.hub_port)):
            _in(netns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                "burst", "32kbit", "latency", "50ms")

    def cut(self, node: Node) -> None:
        """A lost node: its link goes down (no packet in or out; no connection reset)."""
        _ip("-n", node.netns, "link", "set", NIC, "down")

    def close(self) -> None:
        for node in self._every():
            _remove(node.netns)


def _remove(netns: str) -> None:
    """Kill what still runs in the namespace (our test's processes), then remove it and
    its hosts file; the links in it go with it."""
    for _ in range(50):
        pids = _ip("netns", "pids", netns, check=False).stdout.split()
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.1)
    _ip("netns", "del", netns, check=False)
    shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)


def _remove_abandoned() -> None:
    """Namespaces of test runs whose process is gone (killed before their clean-up)."""
    listed = _ip("netns", "list", check=False).stdout.split()
    etc = [p.name for p in NETNS_ETC.glob(f"{PREFIX}-*")] if NETNS_ETC.is_dir() else []
    for name in set(listed + etc):
        parts = name.split("-")
        if len(parts) < 4 or parts[0] != PREFIX or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _remove(name)
        except PermissionError:
            pass


@contextlib.contextmanager
def cluster(labels: list[str]):
    """Nodes `labels` and a hub; skips the test (with the reason) where this machine
    cannot make namespaces, fails it instead under DISTDOCTOR_REQUIRE_NETNS=1 (CI, where
    a skip would hide the tests). Removed whole when the block ends, however it ends."""
    reason = why_not()
    if reason is not None:
        if os.environ.get("DISTDOCTOR_REQUIRE_NETNS"):
            pytest.fail(f"DISTDOCTOR_REQUIRE_NETNS is set, but {reason}")
        pytest.skip(reason)
    _remove_abandoned()
    made = Cluster(labels)
    try:
        made.build()
        yield made
    finally:
        made.close()
