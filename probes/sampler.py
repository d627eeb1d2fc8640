"""One sampler per node: host, rank processes and GPUs, 1 Hz, into the run directory.

    RUN_DIR/probes/node-<host>.jsonl     a header line, then one NodeSample per line
    RUN_DIR/probes/node-<host>.jsonl.1   the previous file, after rotation

Each file is capped (`max_bytes`); when full it becomes ".1" (replacing the older one), so a
node keeps at most twice the cap. A reader skips a torn last line (the file is read while it
grows). Every line says where its GPU readings come from ("live", "replay:<file>", or why there
are none): replayed readings are never shown as live.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import psutil
from distdoctor.probes.checked import Unsound, required, snapshots
from distdoctor.probes.checked import gpu_of_rank as checked_gpu_of_rank
from distdoctor.probes.gpu_map import rank_gpus
from distdoctor.probes.host import HostProbe, HostSnapshot, ProcessSnapshot
from distdoctor.probes.nvml import NvmlProbe
from distdoctor.probes.nvml_values import GpuSnapshot

from distdoctor.errors import UserError
from distdoctor.priority import lower_this_thread

log = logging.getLogger("distdoctor.probes.sampler")

FORMAT = "distdoctor-probes"
VERSION = 1
DEFAULT_MAX_BYTES = 16 << 20
_ENV_KEYS = ("LOCAL_RANK", "CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class NodeSample:
    t: float
    host: str
    nvml: str  # "live" | "replay:<file>" | "no NVIDIA driver (...)"
    host_stats: HostSnapshot | None
    processes: tuple[ProcessSnapshot, ...] = ()
    gpus: tuple[GpuSnapshot, ...] = ()
    gpu_of_rank: Mapping[int, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self):
        object.__setattr__(self, "gpu_of_rank", MappingProxyType(dict(self.gpu_of_rank)))

    def to_json(self) -> dict:
        return {"t": self.t, "host": self.host, "nvml": self.nvml,
                "host_stats": self.host_stats.to_json() if self.host_stats else None,
                "processes": [p.to_json() for p in self.processes],
                "gpus": [g.to_json() for g in self.gpus],
                "gpu_of_rank": {str(r): g for r, g in self.gpu_of_rank.items()}}

    @classmethod
    def from_json(cls, d: dict) -> NodeSample:
        """A sample line's object, each reading checked (checked.py): its time, host and
        GPU source are required; host readings that are no snapshot are none, and a
        process or GPU entry that is none is left out, with the others kept."""
        hs = d.get("host_stats")
        try:
            host_stats = HostSnapshot.from_json(hs) if hs else None
        except Unsound:
            host_stats = None
        return cls(t=required("float", d.get("t")), host=required("str", d.get("host", "?")),
                   nvml=required("str", d.get("nvml", "?")), host_stats=host_stats,
                   processes=snapshots(ProcessSnapshot, d.get("processes", [])),
                   gpus=snapshots(GpuSnapshot, d.get("gpus", [])),
                   gpu_of_rank=checked_gpu_of_rank(d.get("gpu_of_rank")))


def gpu_key(g: GpuSnapshot) -> str:
    """How samples name a GPU: its UUID, else "index:N"."""
    return g.uuid or f"index:{g.index}"


def samples_path(run_dir: str | os.PathLike, host: str | None = None) -> Path:
    return Path(run_dir) / "probes" / f"node-{host or socket.gethostname()}.jsonl"


def rank_meta_on_host(run_dir: str | os.PathLike, host: str) -> dict[int, dict]:
    """rank -> the tracer's rank metadata (local rank, CUDA_VISIBLE_DEVICES, ...) on `host`
    (each file read within bounds and checked: runlog.rundir.rank_meta_at)."""
    from distdoctor.runlog.rundir import rank_meta_at

    out = {}
    for p in (Path(run_dir) / "ranks").glob("rank-*.json"):
        meta, _ = rank_meta_at(p)
        if meta.get("host") == host and "rank" in meta:
            out[meta["rank"]] = meta
    return out


class Sampler:
    """Samples this node every `interval_s` seconds in a background thread.

    `rank_pids()` gives this node's rank -> pid (called each tick). `nvml`: an `NvmlProbe`
    (e.g. over a `ReplayNvml`), or None for the live NVML probe. `rank_info()` may give
    rank -> {"local_rank", "cuda_visible_devices", ...} for mapping GPUs to ranks; by default
    the run dir's rank metadata, else each rank process's environment.
    """

    def __init__(self, run_dir: str | os.PathLike, rank_pids: Callable[[], dict[int, int]],
                 interval_s: float = 1.0, nvml: NvmlProbe | Any | None = None, *,
                 rank_info: Callable[[], Mapping[int, Mapping]] | None = None,
                 max_bytes: int = DEFAULT_MAX_BYTES, clock: Callable[[], float] = time.time):
        self.run_dir = Path(run_dir)
        self.rank_pids = rank_pids
        self.interval_s = interval_s
        self._owns_nvml = nvml is None
        self.nvml = nvml if isinstance(nvml, NvmlProbe) else NvmlProbe(nvml)
        self.rank_info = rank_info
        self.max_bytes = max_bytes
        self.clock = clock
        self.host_probe = HostProbe()
        self.host = self.host_probe.host
        self.path = samples_path(run_dir, self.host)
        self._env_cache: dict[tuple[int, int], dict] = {}
        self._info_cache: tuple[frozenset, dict] | None = None
        self._file = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._latest: NodeSample | None = None
        self._errors_logged: set[str] = set()

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> Sampler:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="distdoctor-sampler",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        ended = True
        if self._thread is not None:
            self._thread.join(timeout)
            ended = not self._thread.is_alive()
            self._thread = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if ended:  # (a tick still under way keeps its fds: their numbers are not reused)
            self.host_probe.close()
        if self._owns_nvml:
            self.nvml.close()

    def latest(self) -> NodeSample | None:
        return self._latest

    def _loop(self) -> None:
        lower_this_thread()  # the ranks' cores are theirs
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as e:  # a probe failure must not end sampling
                if type(e).__name__ not in self._errors_logged:
                    self._errors_logged.add(type(e).__name__)
                    log.warning("distdoctor sampler: %s: %s", type(e).__name__, e)
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind: do not burst
                next_t, delay = time.monotonic(), 0.0
            self._stop.wait(delay)

    # -- one tick ----------------------------------------------------------------------
    def sample(self) -> NodeSample:
        """Read everything once (no writing)."""
        pids = dict(self.rank_pids() or {})
        gpus = self.nvml.snapshot()
        mapping: dict[int, str] = {}
        if gpus:
            by_index = {g.index: g for g in gpus}
            for rank, ident in rank_gpus(self.nvml.devices(), self._rank_info(pids)).items():
                if ident.index in by_index:
                    mapping[rank] = gpu_key(by_index[ident.index])
        nvml = self.nvml.source if self.nvml.available else (
            self.nvml.unavailable_reason or "no NVIDIA driver")
        return NodeSample(t=self.clock(), host=self.host, nvml=nvml,
                          host_stats=self.host_probe.host_snapshot(pids.values()),
                          processes=self.host_probe.processes(pids), gpus=gpus,
                          gpu_of_rank=mapping)

    def tick(self) -> NodeSample:
        """Sample once and append the line to the node's file."""
        s = self.sample()
        self._write(json.dumps(s.to_json(), separators=(",", ":")) + "\n")
        self._latest = s
        return s

    def _rank_info(self, pids: dict[int, int]) -> Mapping[int, Mapping]:
        if self.rank_info is not None:
            return self.rank_info()
        key = frozenset(pids.items())
        if self._info_cache is not None and self._info_cache[0] == key:
            return self._info_cache[1]
        info: dict[int, Mapping] = rank_meta_on_host(self.run_dir, self.host)
        for rank, pid in pids.items():
            if rank in info:
                continue
            if (rank, pid) not in self._env_cache:
                try:
                    env = psutil.Process(pid).environ()
                    self._env_cache[(rank, pid)] = {"local_rank": env.get("LOCAL_RANK"),
                                            "cuda_visible_devices": env.get(
                                                "CUDA_VISIBLE_DEVICES")}
                except psutil.Error:
                    continue
            info[rank] = self._env_cache[(rank, pid)]
        if all(r in info for r in pids):  # complete: reuse until the ranks change
            self._info_cache = (key, info)
        return info

    def _write(self, line: str) -> None:
        if self._file is None:
            self._file = ProbeFile(self.path, self.host, self.interval_s, self.max_bytes)
        self._file.write(line)


class ProbeFile:
    """A node's probe file, written line by line: the header line first, and at the cap
    the file becomes ".1" (the sampler's own, and a collector's copy of another node's)."""

    def __init__(self, path: Path, host: str, interval_s: float,
                 max_bytes: int = DEFAULT_MAX_BYTES):
        self.path, self.host, self.interval_s = path, host, interval_s
        self.max_bytes = max_bytes
        self._file = None

    def write(self, lines: str) -> None:
        """Whole lines, each ending in a newline."""
        if self._file is not None and self._file.tell() + len(lines) > self.max_bytes:
            self._file.close()
            self._file = None
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a")  # noqa: SIM115 - kept open between ticks
            if self._file.tell() == 0:
                self._file.write(json.dumps({"format": FORMAT, "version": VERSION,
                                             "host": self.host, "interval_s": self.interval_s,
                                             "started": time.time()}) + "\n")
        self._file.write(lines)
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _parse_line(line, path: Path) -> NodeSample | None:
    """One line of a probe file: a sample, or None (the header, or a torn line being
    written or cut by a crash). A foreign or newer header is a one-line UserError."""
    try:
        d = json.loads(line)
    except (ValueError, RecursionError):  # (a line nested 100,000 deep)
        return None
    if not isinstance(d, dict):
        return None
    if "format" in d:
        if d["format"] != FORMAT:
            raise UserError(f"{path}: not a distdoctor probe file")
        version = d.get("version", 0)
        if not isinstance(version, int):
            raise UserError(f"{path}: probe file version {version!r} is not a number")
        if version > VERSION:
            raise UserError(f"{path}: probe file version {d['version']} is newer than "
                            f"this distdoctor reads ({VERSION}); upgrade distdoctor")
        return None
    try:
        return NodeSample.from_json(d)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


# A probe file is capped by its writer (DEFAULT_MAX_BYTES, rotated at the cap): one over
# this bound is not a sampler's, and is not read.
MAX_FILE_BYTES = 4 * DEFAULT_MAX_BYTES
TAIL_READ_BYTES = 4 << 20  # what a live reader takes of a probe file per pass, at most


def _read_file(path: Path) -> list[NodeSample]:
    """A probe file's samples. A FIFO, a link or a device at its name, or a file over
    MAX_FILE_BYTES, is a one-line UserError (never a wait, never read whole)."""
    from distdoctor.privatefiles import read_bounded

    try:
        data = read_bounded(path, MAX_FILE_BYTES)
    except FileNotFoundError:
        return []  # rotated away between the listing and the read
    except OSError as exc:
        raise UserError(f"{path}: {exc.strerror or exc}") from None
    lines = data.decode(errors="replace").splitlines()
    return [s for s in (_parse_line(line, path) for line in lines) if s is not None]


def read_samples(run_dir: str | os.PathLike, host: str | None = None) -> list[NodeSample]:
    """Every node's samples in the run dir (or one host's), oldest first."""
    folder = Path(run_dir) / "probes"
    pattern = f"node-{host}.jsonl" if host else "node-*.jsonl"
    out: list[NodeSample] = []
    for p in sorted(folder.glob(pattern)):
        old = p.with_name(p.name + ".1")
        if old.exists():
            out.extend(_read_file(old))
        out.extend(_read_file(p))
    out.sort(key=lambda s: s.t)
    return out


class SampleTail:
    """The samples other processes append to a run dir's probe files, as they come: what
    `distdoctor watch` reads while `distdoctor run`'s sampler writes. Each call returns
    the complete lines added since the last; a rotated file is read from its start (the
    last lines written to the old file before it rotated are not read: a second's worth
    at most, for a live view)."""

    FIRST_READ_BYTES = 256 << 10  # a file found already long: only its newest samples

    def __init__(self, run_dir: str | os.PathLike):
        self.folder = Path(run_dir) / "probes"
        self._pos: dict[Path, tuple[int, int]] = {}  # file -> (inode, offset read to)

    def read_new(self) -> list[NodeSample]:
        out: list[NodeSample] = []
        try:
            paths = sorted(self.folder.glob("node-*.jsonl"))
        except OSError:
            return out
        for path in paths:
            try:
                out.extend(self._read(path))
            except (OSError, UserError, ValueError):
                continue  # a file being replaced, or not ours: skipped, never fatal
        out.sort(key=lambda s: s.t)
        return out

    def _read(self, path: Path) -> list[NodeSample]:
        from distdoctor.privatefiles import open_regular

        fd, st = open_regular(path)  # never a wait on a FIFO, never through a link
        with os.fdopen(fd, "rb") as f:
            inode, offset = self._pos.get(path, (st.st_ino, -1))
            if offset < 0:  # first sight: start near the end, at a line start
                offset = max(0, st.st_size - self.FIRST_READ_BYTES)
            elif inode != st.st_ino or st.st_size < offset:
                offset = 0  # rotated: a new file under the same name
            f.seek(offset)
            data = f.read(TAIL_READ_BYTES)  # the rest, if more, on the next pass
        if offset and path not in self._pos:  # started mid-file: drop the partial line
            cut = data.find(b"\n") + 1
            data, offset = data[cut:], offset + cut
        end = data.rfind(b"\n") + 1  # the last line may be half written: next time
        if end == 0 and len(data) >= TAIL_READ_BYTES:
            end = len(data)  # no line in a whole read: no sampler's, passed over
        self._pos[path] = (st.st_ino, offset + end)
        lines = data[:end].decode(errors="replace").splitlines()
        return [s for s in (_parse_line(line, path) for line in lines) if s is not None]
