"""The message families of NCCL, Gloo and the c10d store that `logscan` recognizes: for
each, how to spot it in a line, what it means, and what to try.

Most specific first: a line takes the first rule that matches. Summaries are
`str.format` templates over the match's named groups.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# --- remedies --------------------------------------------------------------------------
R_FIND_LATE_RANK = (
    "A rank never reached this collective. `distdoctor run` names it within seconds of the "
    "hang, with its stack; post-mortem, enable the Flight Recorder (TORCH_NCCL_TRACE_BUFFER_"
    "SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1) and run `distdoctor diagnose --fr-dump PREFIX`. "
    "Raise timeout= in init_process_group only if the step is legitimately slow.")
R_NCCL_SYSTEM = (
    "Usually the network or shared memory: rerun with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS="
    "INIT,NET) to see which; pin the interface with NCCL_SOCKET_IFNAME; try NCCL_IB_DISABLE=1 "
    "to rule out InfiniBand; in containers give /dev/shm room (--shm-size=1g or --ipc=host).")
R_NCCL_CUDA = (
    "A CUDA call inside NCCL failed: check nvidia-smi for XID errors and memory, rerun with "
    "CUDA_LAUNCH_BLOCKING=1 and NCCL_DEBUG=INFO; a driver/CUDA/NCCL version skew across nodes "
    "also shows this way.")
R_NCCL_USAGE = (
    "Usually two ranks on one GPU or mismatched arguments: call torch.cuda.set_device("
    "LOCAL_RANK) before init_process_group (or pass device_id=), check every rank calls the "
    "same collectives with the same sizes (`distdoctor run` compares them live).")
R_NCCL_REMOTE = (
    "A peer failed first: a rank that exited (see its traceback, an OOM kill in dmesg) or a "
    "network fault. Find the first failure; NCCL_DEBUG=INFO shows which connection broke.")
R_NCCL_INTERNAL = (
    "Often a version skew (NCCL or driver differing across nodes) or a P2P/topology problem: "
    "compare versions on every node, try NCCL_P2P_LEVEL=NVL or NCCL_P2P_DISABLE=1, and rerun "
    "with NCCL_DEBUG=INFO.")
R_SHM = ("NCCL could not allocate shared memory: give the container more /dev/shm "
         "(docker --shm-size=1g or --ipc=host) or set NCCL_SHM_DISABLE=1.")
R_SOCKET = ("A socket between ranks failed: check the address NCCL/Gloo picked is reachable "
            "from every node (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME=eth0, firewall, MTU), "
            "and NCCL_DEBUG=INFO for the interface in use.")
R_IB = ("InfiniBand transport error: check the links (ibstat, ibv_devinfo), NCCL_IB_HCA, "
        "and try NCCL_IB_DISABLE=1 to confirm the job runs over sockets.")
R_P2P = ("GPU peer-to-peer failed: check ACS/IOMMU settings and `nvidia-smi topo -m`; "
         "NCCL_P2P_LEVEL=NVL or NCCL_P2P_DISABLE=1 works around it.")
R_PEER_GONE = ("A peer process went away mid-collective: the real failure is on the rank "
               "that exited first (its traceback, or an OOM kill in dmesg).")
R_GLOO_TIMEOUT = R_FIND_LATE_RANK.replace("(TORCH_NCCL_TRACE_BUFFER_SIZE=2000 "
                                          "TORCH_NCCL_DUMP_ON_TIMEOUT=1)",
                                          "(TORCH_FR_BUFFER_SIZE=2000)")
R_STORE_JOIN = ("Not every rank reached the rendezvous: check that all nodes started, that "
                "--nnodes/--nproc-per-node match WORLD_SIZE, and that MASTER_ADDR:MASTER_PORT "
                "is reachable from every node.")
R_STORE_CONNECT = ("Could not reach the c10d store at MASTER_ADDR:MASTER_PORT: check rank 0's "
                   "host is up and listening, the address and port, and the firewall.")
R_PORT_IN_USE = ("MASTER_PORT is taken, often by a previous run still alive: pick another "
                 "port (--master-port) or stop the stale job.")
R_STORE_GONE = ("The c10d store's server (rank 0 / the launcher's agent) went away: look for "
                "its failure first.")
R_WATCHDOG_STUCK = ("The NCCL watchdog itself made no progress, usually a CUDA call hung in "
                    "the driver: check nvidia-smi and dmesg for XID errors.")


@dataclass(frozen=True)
class Rule:
    """One message family: how to spot it and what it means."""

    name: str
    pattern: re.Pattern
    severity: str
    summary: str  # str.format over the match's named groups
    remedy: str
    timeout: bool = False  # reported by waiting ranks: culprits are those that did not
    victims: bool = False  # reported by ranks that suffer it (a peer left): culprits unknown


def _rule(name, regex, severity, summary, remedy, timeout=False, victims=False) -> Rule:
    return Rule(name, re.compile(regex), severity, summary, remedy, timeout, victims)


# Most specific first: a line takes the first rule that matches.
RULES: tuple[Rule, ...] = (
    _rule("nccl_watchdog_timeout",
          r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), "
          r"OpType=(?P<op>\w+)(?:, NumelIn=(?P<numel_in>-?\d+), NumelOut=(?P<numel_out>-?\d+))?"
          r".*?Timeout\(ms\)=(?P<timeout_ms>\d+)\) ran for (?P<ran_ms>\d+) milliseconds",
          "error", "NCCL watchdog timeout in {op} (SeqNum {seq}) after {ran_s} s",
          R_FIND_LATE_RANK, timeout=True),
    _rule("nccl_watchdog_stuck",
          r"watchdog (?:thread )?(?:got stuck|hang) for (?P<secs>\d+) seconds|"
          r"Heartbeat monitor timed out",
          "error", "the NCCL watchdog thread is stuck", R_WATCHDOG_STUCK),
    _rule("nccl_duplicate_gpu",
          r"Duplicate GPU detected\s*:\s*rank (?P<a>\d+) and rank (?P<b>\d+) both on CUDA "
          r"device (?P<device>\w+)",
          "error", "ranks {a} and {b} share CUDA device {device} (Duplicate GPU detected)",
          R_NCCL_USAGE),
    _rule("nccl_system_error", r"NCCL error.*?unhandled system error",
          "error", "NCCL unhandled system error", R_NCCL_SYSTEM),
    _rule("nccl_cuda_error", r"NCCL error.*?unhandled cuda error|ncclUnhandledCudaError",
          "error", "NCCL unhandled CUDA error", R_NCCL_CUDA),
    _rule("nccl_invalid_usage", r"NCCL error.*?invalid (?:usage|argument)|ncclInvalidUsage",
          "error", "NCCL invalid usage", R_NCCL_USAGE),
    _rule("nccl_remote_error",
          r"NCCL error.*?remote process exited|ncclRemoteError",
          "error", "NCCL remote error: a peer exited or the network failed", R_NCCL_REMOTE, victims=True),
    _rule("nccl_internal_error", r"NCCL error.*?internal (?:check failed|error)|"
          r"ncclInternalError",
          "error", "NCCL internal error", R_NCCL_INTERNAL),
    _rule("nccl_warn_shm", r"NCCL WARN.*?(?:/dev/shm|shm_open|[Ss]hared memory)",
          "error", "NCCL could not set up shared memory", R_SHM),
    _rule("nccl_warn_ib", r"NCCL WARN.*?(?:NET/IB|ibv_|IB ?:)", "warning",
          "NCCL InfiniBand warning", R_IB),
    _rule("nccl_warn_socket",
          r"NCCL WARN.*?(?:NET/Socket|Bootstrap|[Cc]onnect(?:ion)? (?:to|refused|timed out)|"
          r"no socket interface)",
          "warning", "NCCL socket/bootstrap warning", R_SOCKET),
    _rule("nccl_warn_p2p", r"NCCL WARN.*?(?:P2P|peer access|cudaIpc)", "warning",
          "NCCL peer-to-peer warning", R_P2P),
    _rule("nccl_warn_cuda", r"NCCL WARN.*?Cuda failure", "error",
          "NCCL saw a CUDA failure", R_NCCL_CUDA),
    _rule("nccl_warn", r"NCCL WARN\s+(?P<message>.*)", "warning",
          "NCCL WARN: {message}", "Rerun with NCCL_DEBUG=INFO for the context of this warning."),
    _rule("gloo_timeout",
          r"gloo.*?Timed out waiting (?P<timeout_ms>\d+)ms for (?P<op>\w+) operation",
          "error", "Gloo timed out after {timeout_s} s waiting for a {op}", R_GLOO_TIMEOUT,
          timeout=True),
    _rule("gloo_peer_gone",
          r"gloo.*?(?:Connection closed by peer|Connection reset by peer|Broken pipe)",
          "error", "Gloo lost a peer mid-collective (connection closed)", R_PEER_GONE, victims=True),
    _rule("gloo_connect",
          r"gloo.*?(?:Connection refused|Connect timeout|getaddrinfo|No route to host)",
          "error", "Gloo could not connect to a peer", R_SOCKET),
    _rule("store_join_timeout",
          r"Timed out after (?P<secs>\d+) seconds waiting for clients\. "
          r"(?P<joined>\d+)/(?P<world>\d+) clients joined",
          "error", "rendezvous incomplete: {joined} of {world} ranks joined the c10d store "
          "in {secs} s", R_STORE_JOIN, victims=True),
    _rule("store_client_timeout",
          r"client socket has timed out after (?P<ms>\d+)ms while trying to connect to "
          r"\((?P<host>[^,]+), (?P<port>\d+)\)",
          "error", "could not reach the c10d store at {host}:{port}", R_STORE_CONNECT, victims=True),
    _rule("store_port_in_use",
          r"(?:server socket has failed to listen|failed to bind).*?port: (?P<port>\d+).*?"
          r"EADDRINUSE|EADDRINUSE.*?port: (?P<port2>\d+)",
          "error", "c10d store port {port} is already in use", R_PORT_IN_USE),
    _rule("store_wait_timeout", r"(?:DistStoreError|Socket Timeout).*?wait timeout after "
          r"(?P<ms>\d+)ms|wait timeout after (?P<ms2>\d+)ms, keys:",
          "error", "c10d store wait timed out: a rank never published its key", R_STORE_JOIN,
          timeout=True),
    _rule("store_gone", r"(?:TCPStore|DistStoreError|DistNetworkError).*?"
          r"(?:failed to recv, got 0 bytes|Connection reset by peer|Broken pipe)",
          "error", "lost the connection to the c10d store", R_STORE_GONE, victims=True),
)

# Words at least one rule needs: most output is the job's own, and skips every rule at once.
_ANY_RULE = re.compile(r"NCCL|nccl|[Gg]loo|[Ss]tore|Timed out|EADDRINUSE|[Ww]atchdog|"
                       r"Heartbeat|socket|Duplicate GPU")


def match_rule(line: str) -> tuple[Rule | None, re.Match | None]:
    """The first rule that matches `line`, and its match; (None, None) for none."""
    if not _ANY_RULE.search(line):
        return None, None
    for rule in RULES:
        m = rule.pattern.search(line)
        if m:
            return rule, m
    return None, None
