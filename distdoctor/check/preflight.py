"""Before any rank starts: is the job's rendezvous address reachable from this node, and
is its port free where the store will listen? Also: the torchrun line the check runs in
place of the training script."""

from __future__ import annotations

import errno
import ipaddress
import socket
import time

from distdoctor.check.table import Row
from distdoctor.errors import UserError

CONNECT_S = 3.0
TORCHRUN_DEFAULT = ("127.0.0.1", 29500)


def rendezvous_of(cmd: list[str] | None, env: dict) -> tuple[str, int, bool]:
    """(address, port, whether this node hosts the store) of the job: from its torchrun
    line's --rdzv-endpoint or --master-addr/--master-port, else MASTER_ADDR/MASTER_PORT,
    else torchrun's defaults."""
    if cmd:
        args = parse_torchrun(_launcher(cmd)[1])
        if args.standalone:  # torchrun starts its own store on a free local port
            return "127.0.0.1", 0, True
        if args.rdzv_endpoint:
            host, _, port = args.rdzv_endpoint.rpartition(":")
            if not host:
                host, port = port, "29400"
            return host.strip("[]"), int(port), _is_local(host.strip("[]"))
        return (args.master_addr or TORCHRUN_DEFAULT[0],
                int(args.master_port or TORCHRUN_DEFAULT[1]), int(args.node_rank or 0) == 0)
    host = env.get("MASTER_ADDR") or TORCHRUN_DEFAULT[0]
    port = int(env.get("MASTER_PORT") or TORCHRUN_DEFAULT[1])
    return host, port, _is_local(host)


def multi_node(cmd: list[str] | None) -> bool:
    """Whether the job's torchrun line spans more than one node (--nnodes 2, 1:4)."""
    if not cmd:
        return False
    nnodes = str(parse_torchrun(_launcher(cmd)[1]).nnodes or "1")
    return nnodes.split(":")[-1].strip() not in ("", "1")


def check(host: str, port: int, hosts_store: bool, wait_s: float) -> list[Row]:
    """The rendezvous rows: the name resolves; on the node that hosts the store, the port
    is free; from the others, the store answers within `wait_s` (every node's check
    starts at about the same time: the first node's store comes up in seconds)."""
    scope = f"{host}:{port}"
    if port == 0:
        return [Row("rendezvous port", "job", "ok", "--standalone: torchrun picks a free "
                    "port on this node")]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return [Row("rendezvous reachable", scope, "fail", f"{host!r} does not resolve "
                    f"({exc.strerror})", "use the head node's address or a name every node "
                    "resolves (MASTER_ADDR / --master-addr / --rdzv-endpoint)")]
    family, _, _, _, addr = infos[0]
    rows = []
    if hosts_store:
        rows.append(_port_free(family, addr, port, scope))
    else:
        rows.append(_reachable(family, addr, scope, wait_s))
    return rows


def _reachable(family, addr, scope: str, wait_s: float) -> Row:
    deadline = time.monotonic() + wait_s
    while True:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(CONNECT_S)
        try:
            s.connect(addr)
            return Row("rendezvous reachable", scope, "ok", "the store answers")
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                return Row("rendezvous reachable", scope, "fail",
                           f"nothing answered there for {wait_s:g} s",
                           "start the check (or the job) on the first node too, or fix the "
                           "address and port (MASTER_ADDR / --master-addr / --rdzv-endpoint)")
            time.sleep(0.5)
        except TimeoutError:
            return Row("rendezvous reachable", scope, "fail", f"no answer within "
                       f"{CONNECT_S:g} s (a firewall, or the wrong address)",
                       "open the port between the nodes, or use the head node's address "
                       "on the network the nodes share")
        except OSError as exc:
            return Row("rendezvous reachable", scope, "fail", f"cannot reach it: "
                       f"{exc.strerror or exc}", "use an address every node can route to")
        finally:
            s.close()


def _port_free(family, addr, port: int, scope: str) -> Row:
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.bind((addr[0], port))
        return Row("rendezvous port", scope, "ok", "free on this node (the store's)")
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return Row("rendezvous port", scope, "fail",
                       f"port {port} is taken on this node{_owner(port)}: the store cannot "
                       f"listen there", "stop what holds it (a job from before?) or pick "
                       "another --master-port / MASTER_PORT on every node")
        if exc.errno == errno.EADDRNOTAVAIL:
            return Row("rendezvous port", scope, "fail", f"{addr[0]} is not an address of "
                       f"this node, yet it should host the store", "run the first node on "
                       "the host MASTER_ADDR names, or fix the address")
        return Row("rendezvous port", scope, "fail", f"cannot listen: {exc.strerror or exc}",
                   "pick another port")
    finally:
        s.close()


def _owner(port: int) -> str:
    """' (python, pid 123)' when psutil can tell who listens on the port."""
    try:
        import psutil

        for c in psutil.net_connections("tcp"):
            if c.laddr and c.laddr.port == port and c.status == "LISTEN" and c.pid:
                return f" ({psutil.Process(c.pid).name()}, pid {c.pid})"
    except Exception:
        pass
    return ""


def _is_local(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(socket.gethostbyname(host))
    except (OSError, ValueError):
        return False
    if ip.is_loopback:
        return True
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((str(ip), 0))
        s.close()
        return True
    except OSError:
        return False


# --- the job's own launcher line -----------------------------------------------------------
def parse_torchrun(argv: list[str]):
    """torchrun's own reading of its options (torch.distributed.run's parser)."""
    from torch.distributed.run import get_args_parser

    try:
        return get_args_parser().parse_args(argv)
    except SystemExit:
        raise UserError("check: the command after -- is not a torchrun line torchrun "
                        "accepts", 2) from None


def check_command(cmd: list[str]) -> list[str]:
    """The job's launcher line with the check's rank program in place of the training
    script: `torchrun [its options] -m distdoctor.check.rank`."""
    import sys

    head, argv = _launcher(cmd)
    args = parse_torchrun(argv)
    # the script is the first argument torchrun did not take as an option (or its value)
    script_at = len(argv) - len(args.training_script_args) - 1
    if script_at < 0 or argv[script_at] != args.training_script:
        raise UserError("check: cannot tell where the training script starts in the "
                        "torchrun line", 2)
    options = argv[:script_at]
    if args.no_python:
        return head + options + [sys.executable, "-m", "distdoctor.check.rank"]
    if args.module:
        return head + options + ["distdoctor.check.rank"]
    return head + options + ["-m", "distdoctor.check.rank"]


def _launcher(cmd: list[str]) -> tuple[list[str], list[str]]:
    """(the part that starts torchrun, torchrun's arguments)."""
    import os

    if cmd and os.path.basename(cmd[0]) == "torchrun":
        return cmd[:1], cmd[1:]
    for i, word in enumerate(cmd[:-1]):
        if word == "-m" and cmd[i + 1] in ("torch.distributed.run",
                                           "torch.distributed.launch"):
            return cmd[:i + 2], cmd[i + 2:]
    raise UserError("check: wrap the job's torchrun line (distdoctor check -- torchrun ... "
                    "train.py), or use --nproc N; other launchers can start "
                    "`python -m distdoctor.check.rank` as each rank", 2)
