"""Xid events in the node's kernel log: what the NVIDIA driver reported before the check
ran (NVML's Xid events only start at the check). A GPU that fell off the bus, or that
had a double-bit ECC error an hour ago, is worth knowing about before a job lands on it.

The driver prints (open-gpu-kernel-modules, src/nvidia/src/kernel/gpu/rc/kernel_rc.c):

    NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, <message>
    NVRM: Xid (PCI:%04x:%02x:%02x): %d, <message>            (no process to name)

and a MIG GPU adds " GPU-I:%02u GPU-CI:%02u" inside the parenthesis. The log is read from
/dev/kmsg (records "prio,seq,usec,flags;text", usec since boot), else from journalctl.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import time

from distdoctor.check.table import Row
from distdoctor.probes.xids import APPLICATION, DRAIN, RESET_SOON, meaning
from distdoctor.probes.xids import KERNEL_XID as _XID

REPLAY_ENV = "DISTDOCTOR_KMSG_REPLAY"  # tests: a file of /dev/kmsg records read instead
MAX_EVENTS = 200  # a GPU in trouble can log an Xid a second: the newest are kept

_PROCESS = re.compile(r"^pid=[^,]*, name=[^,]*, ")

def read(since_s: float | None = None) -> dict:
    """{"source", "events": [{"pci", "xid", "message", "age_s"}], "error"}: the Xids in
    the kernel log (the last `since_s` seconds, or since boot). "error" says why the log
    could not be read (then "events" is empty)."""
    replay = os.environ.get(REPLAY_ENV)
    if replay:
        got = _from_kmsg(replay)
    else:
        got = _from_kmsg("/dev/kmsg")
        if got.get("error"):
            journal = _from_journal()
            if not journal.get("error"):
                got = journal
    if since_s is not None:
        got["events"] = [e for e in got["events"] if e["age_s"] <= since_s]
    return got


def parse(text: str, age_s: float) -> dict | None:
    """One kernel message -> an Xid event, or None."""
    m = _XID.search(text)
    if not m:
        return None
    return {"pci": m["pci"].lower(), "xid": int(m["xid"]),
            "message": _PROCESS.sub("", m["rest"]).strip()[:200], "age_s": round(age_s, 1)}


def _from_kmsg(path: str) -> dict:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return {"source": path, "events": [], "error": exc.strerror or str(exc)}
    replay = path != "/dev/kmsg"
    found: list[tuple[int, str]] = []  # (usec since boot, text) of the Xid records
    last_usec = 0
    try:
        # /dev/kmsg hands one record per read; a replay file is read whole
        chunks = [os.read(fd, 1 << 20)] if replay else _records(fd)
        for chunk in chunks:
            for record in chunk.decode("utf-8", "replace").splitlines():
                head, sep, text = record.partition(";")
                try:
                    usec = int(head.split(",")[2])
                except (IndexError, ValueError):
                    continue  # a continuation line, or not a record
                last_usec = max(last_usec, usec)
                if sep and "NVRM: Xid" in text:
                    found.append((usec, text))
                    del found[:-MAX_EVENTS]
    except OSError as exc:
        return {"source": path, "events": [], "error": exc.strerror or str(exc)}
    finally:
        os.close(fd)
    # a replay is read as of its last record (its ages do not depend on this machine)
    now_s = last_usec / 1e6 if replay else _uptime_s()
    events = [e for usec, text in found if (e := parse(text, max(0.0, now_s - usec / 1e6)))]
    return {"source": path, "events": events, "error": None}


def _records(fd: int):
    while True:
        try:
            record = os.read(fd, 8192)
        except BlockingIOError:
            return  # read to the end of the ring
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                continue  # the ring overwrote the record under us: go on with the next
            raise
        if not record:
            return
        yield record


def _from_journal() -> dict:
    """journalctl -k, for a user who may read the journal but not /dev/kmsg."""
    try:
        out = subprocess.run(["journalctl", "-k", "-b", "-q", "--no-pager", "-o",
                              "short-unix", "-g", "NVRM: Xid"], capture_output=True,
                             text=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"source": "journalctl", "events": [], "error": str(exc)}
    if out.returncode not in (0, 1):  # 1: nothing matched
        return {"source": "journalctl", "events": [],
                "error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    now = time.time()
    events = []
    for line in out.stdout.splitlines():
        stamp = line.split(" ", 1)[0]
        try:
            age = now - float(stamp)
        except ValueError:
            continue
        event = parse(line, max(0.0, age))
        if event:
            events.append(event)
    return {"source": "journalctl", "events": events[-MAX_EVENTS:], "error": None}


def _uptime_s() -> float:
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


# --- judged, per node ------------------------------------------------------------------
RECENT_S = 24 * 3600  # an Xid older than a day is history: a warning at most


def rows(log: dict | None, gpus: list[dict] | None, scope: str) -> list[Row]:
    """The node's "GPU kernel log" rows: one per (GPU, Xid) seen, or one that all is well.
    `gpus`: NVML's view of the node (None: no driver), to name a GPU by its index."""
    if log is None or "events" not in log:
        return []
    if log.get("error"):
        if gpus is None:
            return []  # no GPU here, as far as anyone can tell: nothing to miss
        return [Row("GPU kernel log", scope, "n/a", f"the kernel log cannot be read "
                    f"({log.get('source')}: {log['error']}): Xids from before the check "
                    f"are unknown", "run the check as root, or let the user read the "
                    "journal (the systemd-journal group)")]
    index = {_pci_key(g.get("pci_bus_id")): g.get("index") for g in gpus or []}
    seen: dict[tuple[str, int], list[dict]] = {}
    for e in log["events"]:
        seen.setdefault((e["pci"], e["xid"]), []).append(e)
    out = []
    for (pci, xid), events in sorted(seen.items()):
        newest = min(e["age_s"] for e in events)
        recent = newest <= RECENT_S
        if not recent and xid not in DRAIN:
            continue  # said of the GPU then: NVML's remap and ECC state says it now
        gpu = f"GPU {index[pci]} ({pci})" if index.get(pci) is not None else f"GPU {pci}"
        times = f", {len(events)} times" if len(events) > 1 else ""
        out.append(Row(
            "GPU kernel log", scope, "fail" if xid in DRAIN and recent else "warn",
            f"Xid {xid} ({meaning(xid)}) on {gpu}{times}, last {_ago(newest)} ago: "
            f"{events[-1]['message'][:120]}", _REMEDY.get(_kind(xid))))
    if not out and gpus is not None:
        older = f" ({len(log['events'])} older Xids, none that needs a drain)" \
            if log["events"] else ""
        out.append(Row("GPU kernel log", scope, "ok",
                       f"no recent Xid in the kernel log{older}"))
    return out


_REMEDY = {
    "drain": "drain the node; reset the GPU (nvidia-smi -r) or reboot, and replace it if it "
             "recurs (NVIDIA's Xid catalog gives each Xid's action)",
    "reset": "reset the GPU when it is idle (nvidia-smi -r): pending row remaps apply then",
    "application": "most often the job that ran then (a bad kernel, a killed process): the "
                   "GPU may be fine; read that job's error",
    None: "look the Xid up in NVIDIA's Xid catalog for its action",
}


def _kind(xid: int) -> str | None:
    return ("drain" if xid in DRAIN else "reset" if xid in RESET_SOON
            else "application" if xid in APPLICATION else None)


def _pci_key(bus_id: str | None) -> str | None:
    """NVML's "00000000:3B:00.0" -> the driver's "0000:3b:00"."""
    if not bus_id:
        return None
    try:
        domain, bus, rest = bus_id.split(":")
        return f"{int(domain, 16) & 0xFFFF:04x}:{int(bus, 16):02x}:{int(rest.split('.')[0], 16):02x}"
    except ValueError:
        return None


def _ago(s: float) -> str:
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.0f} days"
