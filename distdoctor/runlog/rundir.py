"""Run directory layout, version 1 (documented in docs/run-dir.md):

    RUN_DIR/
      run.json                 job: format, version, command, world size, created
      ranks/rank-00003.json    rank 3: host, pid, local rank, device, torch, backend, clocks
      ranks/rank-00003.ring    rank 3's event log (see runlog.format)
      ranks/rank-00003.1.ring  rank 3's second log (it started again), with .1.json; ...
      findings.json            written by the diagnosis engine
      exits.json               the processes' exit codes (`run`, or a collector's copy)
      sources/                 the job's source files the call sites name: hashes, copies
                               within bounds (runlog/sources.py)

Files are written under a fresh temporary name (O_EXCL | O_NOFOLLOW) and renamed into
place: never through a link, and a reader sees a whole file.

Readers reject a missing, foreign or newer directory with one line (`UserError`).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from distdoctor.errors import UserError
from distdoctor.privatefiles import read_json, write_atomically

RUN_FORMAT = "distdoctor-run"
RUN_VERSION = 1
DEFAULT_ROOT = "distdoctor-runs"
ENV_RUN_DIR = "DISTDOCTOR_RUN_DIR"


_LOG_NAME = re.compile(r"rank-(\d+)(?:\.(\d+))?\.(ring|json)\Z")


def rank_stem(rank: int, number: int = 0) -> str:
    """`rank-00003` for a rank's first log, `rank-00003.2` for its third."""
    return f"rank-{rank:05d}" + (f".{number}" if number else "")


def ring_path(run_dir: str | os.PathLike, rank: int, number: int = 0) -> Path:
    return Path(run_dir) / "ranks" / f"{rank_stem(rank, number)}.ring"


def rank_meta_path(run_dir: str | os.PathLike, rank: int, number: int = 0) -> Path:
    return Path(run_dir) / "ranks" / f"{rank_stem(rank, number)}.json"


def parse_log_name(name: str) -> tuple[int, int, str] | None:
    """(rank, log number, "ring" | "json") of a file in ranks/, None for any other name."""
    m = _LOG_NAME.match(name)
    return None if m is None else (int(m[1]), int(m[2] or 0), m[3])


def rank_logs(run_dir: str | os.PathLike) -> dict[int, list[int]]:
    """rank -> the numbers of its event logs, in order."""
    out: dict[int, list[int]] = {}
    try:
        names = os.listdir(Path(run_dir) / "ranks")
    except OSError:
        return out
    for name in names:
        parsed = parse_log_name(name)
        if parsed is not None and parsed[2] == "ring":
            out.setdefault(parsed[0], []).append(parsed[1])
    return {r: sorted(ns) for r, ns in sorted(out.items())}


def next_log_number(run_dir: str | os.PathLike, rank: int) -> int:
    """Where a rank's new log starts looking for a free name: after its newest."""
    return max(rank_logs(run_dir).get(rank, [-1])) + 1


def new_run_dir(root: str | os.PathLike = DEFAULT_ROOT, tag: str | None = None) -> Path:
    """A fresh, uniquely named run directory under `root` (created)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{stamp}-{tag or os.getpid()}"
    path, n = base, 1
    while True:
        try:
            (path / "ranks").mkdir(parents=True, exist_ok=False)
            return path
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}-{n}")


COLLECTOR = "watch --listen"
COLLECTOR_LAUNCHER = "distdoctor watch --listen"  # run.json's launcher in a collector's copy


def claim_run_dir(path: str | os.PathLike | None, who: str) -> Path:
    """The run dir a new job writes: the one asked for, which must not hold a run yet
    (created if missing), or a fresh one under DEFAULT_ROOT. The collector (`who` is
    COLLECTOR) may also take its own copy back (one a collector made: started again, it
    picks the nodes up where they were), said in one line; anything else is refused."""
    if not path:
        return new_run_dir()
    run_dir = Path(path)
    if (run_dir / "run.json").exists():
        if who == COLLECTOR and _is_collector_copy(run_dir):
            import sys

            print(f"distdoctor: {who}: {run_dir} is a collector's copy already: collecting "
                  f"into it again (each node's copy goes on where it was)", file=sys.stderr)
            return run_dir
        raise UserError(f"{who}: {run_dir} already holds a run; choose a new --run-dir")
    (run_dir / "ranks").mkdir(parents=True, exist_ok=True)
    return run_dir


def _is_collector_copy(run_dir: Path) -> bool:
    """run.json says a collector made this dir (its launcher), and ranks/ is a real dir."""
    try:
        meta = _load_json(run_dir / "run.json", "run metadata")
    except UserError:
        return False
    ranks = run_dir / "ranks"
    return (meta.get("format") == RUN_FORMAT and meta.get("launcher") == COLLECTOR_LAUNCHER
            and ranks.is_dir() and not ranks.is_symlink())


def write_json_atomic(path: str | os.PathLike, data: dict, indent: int | None = 2) -> None:
    """Write JSON so a concurrent reader sees the old file or the new one, never half.
    Written under a fresh name (O_EXCL | O_NOFOLLOW: never through a link, never over
    another writer's temp file, two threads at once included), then renamed over `path`
    (a rename replaces a link there, never follows it)."""
    write_bytes_atomic(path, (json.dumps(data, indent=indent, default=str) + "\n").encode())


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    write_atomically(os.fspath(path), data)


def write_run_meta(run_dir: str | os.PathLike, **fields) -> None:
    meta = {"format": RUN_FORMAT, "version": RUN_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **fields}
    (Path(run_dir) / "ranks").mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(run_dir) / "run.json", meta)


def newest_run_dir(root: str | os.PathLike = DEFAULT_ROOT) -> Path:
    """The most recently modified run under `root`, for commands whose RUN_DIR is optional."""
    root = Path(root)
    runs = [p for p in root.glob("*") if (p / "run.json").is_file() or (p / "ranks").is_dir()]
    if not runs:
        raise UserError(f"no run directory given and none found under ./{root}")
    return max(runs, key=lambda p: p.stat().st_mtime)


# Everything in a run dir is written by ranks (other users' processes on shared nodes,
# crashed jobs, copies from elsewhere): read within bounds, never through a link, never
# waited on (a FIFO), and a value of the wrong type is no value.
MAX_RUN_META_BYTES = 4 << 20  # run.json: ~300 bytes written (a collector's: a few KB)
MAX_RANK_META_BYTES = 1 << 20  # ranks/rank-N.json: ~1.5 KB written
MAX_WORLD_SIZE = 1 << 18  # the collector's bound on ranks in one copy (collect/limits.py)
MAX_RANK = 1 << 24


def why_unreadable(exc: BaseException) -> str:
    """An OSError or ValueError of read_json, in words for one line."""
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON (truncated?): {exc.msg} at line {exc.lineno}"
    if isinstance(exc, UnicodeDecodeError):
        return "not text"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc) or type(exc).__name__


def _load_json(path: Path, what: str, limit: int = MAX_RUN_META_BYTES) -> dict:
    try:
        data = read_json(path, limit)
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {why_unreadable(exc)}") from None
    except ValueError as exc:
        raise UserError(f"{what} {path} is {why_unreadable(exc)}") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {path} is not a JSON object")
    return data


@dataclass(frozen=True)
class RunInfo:
    path: Path
    meta: dict  # run.json
    ranks: dict[int, dict]  # rank -> rank-NNNNN.json (may be empty for a rank that died early)
    ring_ranks: list[int]  # ranks that have an event log
    logs: dict[int, list[int]] = field(default_factory=dict)  # rank -> its log numbers
    notes: list[str] = field(default_factory=list)  # files of the run dir read in part or not

    @property
    def hang_timeout_s(self) -> float | None:
        """The fixed hang timeout the run was started with (`--hang-timeout S`), or None:
        hangs decided by progress (`auto`, the default)."""
        t = self.meta.get("hang_timeout_s")
        ok = isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < 1e9
        return float(t) if ok else None  # (not nan, inf, nor 10**400: float() overflows)

    @property
    def world_size(self) -> int | None:
        """run.json's world size, where it is one (1 to MAX_WORLD_SIZE)."""
        ws = self.meta.get("world_size")
        return ws if _RANK_META_FIELDS["world_size"](ws) else None


def open_run_dir(path: str | os.PathLike | None) -> RunInfo:
    """Validate and describe a run directory; one-line `UserError` when it is not usable."""
    run = Path(path) if path is not None else newest_run_dir()
    if not run.exists():
        raise UserError(f"run directory {run} does not exist")
    if not run.is_dir():
        raise UserError(f"{run} is not a directory")
    meta_file = run / "run.json"
    if not meta_file.is_file():
        raise UserError(f"{run} is not a distdoctor run directory (no run.json)")
    meta = _load_json(meta_file, "run metadata")
    if meta.get("format") != RUN_FORMAT:
        raise UserError(f"{run} is not a distdoctor run directory "
                        f"(run.json format is {meta.get('format')!r})")
    version = meta.get("version")
    if not isinstance(version, int) or version > RUN_VERSION:
        raise UserError(f"{run} was written by a newer distdoctor (run format version "
                        f"{version}; this one reads up to {RUN_VERSION}): upgrade distdoctor")
    ranks_dir = run / "ranks"
    ranks: dict[int, dict] = {}
    notes: list[str] = []
    if ranks_dir.is_dir():
        for p in sorted(ranks_dir.glob("rank-*.json")):
            parsed = parse_log_name(p.name)
            if parsed is not None and parsed[1] == 0:
                ranks[parsed[0]], note = rank_meta_at(p)
                if note:
                    notes.append(note)
    logs = rank_logs(run)
    from distdoctor.runlog import kept

    kept.attach(run)  # the diagnosis reads the sources this run kept
    return RunInfo(run, meta, ranks, sorted(logs), logs, notes)


def read_rank_meta(run_dir: str | os.PathLike, rank: int, number: int = 0) -> dict:
    """A rank log's metadata, checked (rank_meta_at); {} when missing, {"unreadable": True}
    when it is not a JSON object of ours."""
    meta, _ = rank_meta_at(rank_meta_path(run_dir, rank, number))
    return meta


def rank_meta_at(path: Path) -> tuple[dict, str | None]:
    """(the rank metadata at `path`, checked: each field distdoctor reads is of its type
    and within bounds, or left out; a line saying what was wrong with the file, or None).
    ({}, None) when there is none (yet); ({"unreadable": True}, why) when the file is no
    JSON object within MAX_RANK_META_BYTES: a FIFO, a link, /dev/zero, 100,000 brackets."""
    try:
        data = read_json(path, MAX_RANK_META_BYTES)
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError) as exc:
        return {"unreadable": True}, f"{path}: rank metadata unreadable ({why_unreadable(exc)})"
    if not isinstance(data, dict):
        return {"unreadable": True}, f"{path}: rank metadata is not a JSON object"
    wrong = [k for k, ok in _RANK_META_FIELDS.items() if k in data and not ok(data[k])]
    if not wrong:
        return data, None
    for k in wrong:
        del data[k]
    return data, (f"{path}: rank metadata's {', '.join(wrong)} not of "
                  f"{'its' if len(wrong) == 1 else 'their'} type or out of bounds: left out")


def _int_in(low: int, high: int, none_ok: bool = False):
    return lambda v: ((v is None and none_ok)
                      or (type(v) is int and low <= v < high))  # (a bool is no int here)


def _text_within(limit: int, none_ok: bool = False):
    return lambda v: (v is None and none_ok) or (isinstance(v, str) and len(v) <= limit)


def _clock_pair(v) -> bool:
    return isinstance(v, dict) and all(
        type(v.get(k)) is int and 0 < v[k] < 1 << 63 for k in ("wall_ns", "monotonic_ns"))


_INT64 = 1 << 63
# the fields of rank metadata that readers use (the tracer writes them: tracer/install.py)
_RANK_META_FIELDS = {
    "rank": _int_in(0, MAX_RANK),
    "log_number": _int_in(0, _INT64),
    "world_size": _int_in(1, MAX_WORLD_SIZE + 1),
    "local_rank": _int_in(0, MAX_RANK, none_ok=True),
    "local_world_size": _int_in(1, MAX_RANK, none_ok=True),
    "restart_count": _int_in(0, _INT64, none_ok=True),
    "pid": _int_in(1, 1 << 31),  # (os.kill takes a C int)
    "host": _text_within(1024),
    "backend": _text_within(256, none_ok=True),
    "torch": _text_within(256),
    "python": _text_within(256),
    "cuda_visible_devices": _text_within(4096, none_ok=True),
    "clock": _clock_pair,
    "launch": lambda v: isinstance(v, dict),
    "ring": lambda v: isinstance(v, dict),
    "backend_names": lambda v: isinstance(v, dict),
    "traced_ops": lambda v: isinstance(v, dict),
    "untraceable_ops": lambda v: isinstance(v, list),
    "argv": lambda v: isinstance(v, list),
}
