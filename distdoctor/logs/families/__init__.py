"""The message families, one module each. A family reads one line at a time and says what
it means as `Signal`s; the first family (in this order) that knows a line wins it, so the
more specific families come first. Tracebacks are followed beside them (exceptions.py).

A family module also says what its problems mean, for the reasoning (reasoning.py):
- `describe(problem, ctx) -> Finding` for its causes;
- `TIMEOUTS = {rule: (text(problem), remedy)}` for what its waiting ranks reported, and
  `owners(problem, ctx)` when the message itself names the rank waited for;
- `VICTIMS = {rule: text or text(problem)}` for what ranks that lost a peer reported;
- `prepare(causes)` to merge its causes before they are judged (optional).

Adding a family: a module with a `Family` subclass (its anchors and its rules) and those
meanings, listed in FAMILIES and MEANINGS here, with a cover string in ANCHORS.
"""

from distdoctor.logs.families import (
    ddp,
    exceptions,
    gloo,
    k8s,
    launcher,
    mismatch,
    nccl,
    nccl_sizes,
    oom,
    ras,
    ray,
    slurm,
    stalls,
    store,
    xid,
)
from distdoctor.logs.families.context import ContextFamily
from distdoctor.logs.families.cuda import CudaErrors
from distdoctor.logs.families.ddp import DdpFamily
from distdoctor.logs.families.exceptions import Tracebacks, UsageErrors
from distdoctor.logs.families.gloo import GlooFamily
from distdoctor.logs.families.k8s import K8sFamily
from distdoctor.logs.families.launcher import LauncherFamily
from distdoctor.logs.families.mismatch import MismatchFamily
from distdoctor.logs.families.nccl import NcclFamily
from distdoctor.logs.families.nccl_sizes import NcclSizeFamily
from distdoctor.logs.families.oom import OomFamily
from distdoctor.logs.families.progress import ProgressFamily
from distdoctor.logs.families.ras import RasFamily
from distdoctor.logs.families.ray import RayFamily
from distdoctor.logs.families.slurm import SlurmFamily
from distdoctor.logs.families.stalls import StallFamily
from distdoctor.logs.families.store import StoreFamily
from distdoctor.logs.families.unknown import UnknownErrors
from distdoctor.logs.families.xid import XidFamily

FAMILIES = (ProgressFamily, LauncherFamily, OomFamily, MismatchFamily, DdpFamily, StallFamily,
            StoreFamily, XidFamily,
            CudaErrors, NcclSizeFamily, NcclFamily, GlooFamily, RayFamily, SlurmFamily,
            RasFamily, K8sFamily, UsageErrors, ContextFamily)

# what each family's problems mean, by the family name its signals carry
MEANINGS = {"launcher": launcher, "oom": oom, "mismatch": mismatch, "ddp": ddp,
            "store": store, "nccl": nccl, "nccl_size": nccl_sizes, "gloo": gloo, "exception": exceptions,
            "startup": exceptions, "ray": ray, "slurm": slurm, "ras": ras,
            "k8s": k8s, "stall": stalls, "xid": xid}

# every byte string some family routes on (a family reads only lines holding one of its own)
ROUTES: tuple[bytes, ...] = tuple(sorted({a for f in FAMILIES + (Tracebacks, UnknownErrors)
                                          for a in f.anchors}))

# What the reader searches big logs for: a short cover of ROUTES, so that every line a family
# reads holds one of these too (tests/test_log_diagnosis.py checks it on the whole corpus).
# Few and rare is fast: a search costs a pass over the log, except for strings with a byte
# that is rare in it (capitals, '_', '"', digits), which the reader rules out almost free.
ANCHORS: tuple[bytes, ...] = (
    # exceptions and tracebacks; DDP's and the store's errors are exceptions too; errors no
    # family knows (unknown.py)
    b"Traceback", b'File "', b"Error", b"Exception", b"Expected to have", b"Parameter",
    b"Failure", b"what():", b"Fatal Python error", b"Aborted", b"Segmentation fault",
    b"Bus error", b"Illegal instruction", b"Floating point exception", b"Caught signal",
    b"received at time=", b"Process received signal", b"Signal: ", b"End of error message",
    # launchers
    b"SIG", b"FAILED", b"Failures:", b"Root Cause", b"exitcode", b"host      :",
    b"local_rank", b"error_file", b"with PID", b"orcefully terminating", b"srun: error", b"death signal", b"Terminating StepId", b"time      :",
    b"new nodes from group_rank", b"return code = ", b"terminated with the following",
    # NCCL, CUDA, OOM
    b"NCCL", b"nccl", b"Watchdog", b"Heartbeat", b"Duplicate GPU", b"Cuda failure", b"Bootstrap", b"NVLS", b"NET/",
    b"peer access", b"shared memory", b"essage truncated", b"ibv_", b"IBV_", b"cudaIpc", b"out of memory",
    b"Out of memory", b"oom-kill", b"oom_kill", b"out-of-memory", b"is killed by signal",
    b"DefaultCPUAllocator", b"Killed", b"CUDA error: ", b"_STATUS_", b"Assertion `", b"Xid",
    # c10d store, rendezvous, Gloo
    b"socket has", b"already in use", b"EADDRINUSE", b"endezvous", b"C10d store",
    b"clients joined", b"wait timeout", b"Socket Timeout", b"imeout waiting for key",
    # (a barrier's "Rank 0: Completed store-based barrier" holds "Rank ", vLLM's "No available
    # shared memory broadcast block" holds "shared memory": no word of their own to search)
    b"store based barrier", b"waitForInput", b"ncclUniqueId", b"by peer", b"Broken pipe", b"Timed out waiting",
    b"Connection refused", b"Connect timeout", b"getaddrinfo", b"No route to host",
    b"resolve hostname", b"connectFullMesh", b"Unable to find address",
    b"Received data size", b"length <= op.nbytes",
    # DETAIL mode, monitored barrier, DDP, argparse
    b"Detected mismatch", b"monitoredBarrier", b"DDP expects", b": error: ",
    # orchestrators: Ray (an ActorDiedError's field lines follow it: reader.FOLLOW), Slurm, a
    # launcher not found, NCCL RAS (its per-rank lines follow its head), Kubernetes
    b"A worker died or was killed", b"ActorDiedError", b"RayActorError", b"ActorUnavailable",
    b"Worker exit type", b"Memory on the node", b"The actor is dead", b"RayTaskError",
    b"world_rank=", b"world_size=", b"CANCELLED AT", b"FAILED (non-zero", b"Task launch for",
    b"execve()", b"not found", b"No such file or directory", b"Communicator ranks have different",
    b"DEAD", b") MISMATCH", b") ERROR", b") INCOMPLETE", b"OOMKilled",
    b"The node was low on resource", b"replica(s) failed",
    # evidence: the world, the ranks, progress bars
    b"WORLD_SIZE", b"orld_size", b"orld size", b"MEMBER:", b"Num processes", b"nRanks",
    b"Rank ", b"GLOBAL_RANK", b"Process rank", b"[rank: ", b"%|",
)
