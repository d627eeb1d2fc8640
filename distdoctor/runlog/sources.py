"""The sources a run is judged by, kept in the run dir (`RUN_DIR/sources/`).

The diagnosis reads the user's program (the branch where ranks parted, the condition of
an `if`): read at diagnosis time from wherever a call site's path points, an edited file
or another machine gives another program. So each rank notes the files its call sites
name, and a thread of its own (never the thread that issued the op) keeps, once per run:

- for a user's file, its SHA-256 and size, and a copy of its bytes while the run's copies
  stay within bounds (KEEP_FILE_BYTES a file, KEEP_RUN_BYTES a run);
- for a framework's or the stdlib's file (site-packages, dist-packages, the interpreter's
  own library), its path and the package's version, never its content.

    sources/manifest.json      {"format": "distdoctor-sources", "version": 1, bounds,
                                "kept_bytes", "files": {path: entry}}
    sources/<sha256>.src       a kept copy, named by its content's hash

The ranks of a node share the work under an flock of `sources/.lock`: the first to take
a file keeps it and the others find it in the manifest. Every file is written under a
fresh name (O_EXCL | O_NOFOLLOW) and renamed into place. DISTDOCTOR_SOURCES=0 (`run
--no-source`) keeps hashes only, no copy.

The reading side (runlog/kept.py) is what the diagnosis asks for a file's text.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import stat
import sys
import threading
from pathlib import Path

from distdoctor.privatefiles import parse_json, read_regular, write_atomically
from distdoctor.runlog import reentry

ENV = "DISTDOCTOR_SOURCES"
DIR = "sources"
MANIFEST = "manifest.json"
FORMAT = "distdoctor-sources"
VERSION = 1
KEEP_FILE_BYTES = 1 << 20  # a file larger is hashed, not kept
KEEP_RUN_BYTES = 8 << 20  # the copies of a run, all of them
HASH_MAX_BYTES = 64 << 20  # a file larger is named by size only
MAX_MANIFEST = 16 << 20
MAX_FILES = 20_000  # entries of a manifest
EXIT_WAIT_S = 0.5  # at exit, the longest a rank waits for its keeper to write
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def enabled() -> bool:
    """Whether copies are kept (hashes are always): DISTDOCTOR_SOURCES=0 turns them off."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "no", "false")


# --- which files are the user's -------------------------------------------------------
def _library_roots() -> tuple[str, ...]:
    import sysconfig

    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(Exception):
            roots.add(sysconfig.get_paths()[key].rstrip("/") + "/")
    return tuple(sorted(roots))


_ROOTS = None


def library_of(path: str) -> tuple[str, str] | None:
    """(package, version) of a framework's or the stdlib's file; None for the user's."""
    global _ROOTS
    marker = next((m for m in ("/site-packages/", "/dist-packages/") if m in path), None)
    if marker is not None:
        top = path.split(marker, 1)[1].split("/", 1)[0]
    else:
        if _ROOTS is None:
            _ROOTS = _library_roots()
        root = next((r for r in _ROOTS if path.startswith(r)), None)
        if root is None:
            return None
        top = path[len(root):].split("/", 1)[0]
        if "-packages" not in root and not top.endswith("-packages"):
            return "python", sys.version.split()[0]
    top = top.removesuffix(".py").split(".", 1)[0]
    return top, _version_of(top)


def _version_of(top: str) -> str:
    version = getattr(sys.modules.get(top), "__version__", None)
    if isinstance(version, str):
        return version
    try:
        from importlib import metadata

        return metadata.version(top)
    except Exception:
        return "?"


def files_of(site) -> list[str]:
    """The absolute paths a call site names: its line, its callers', its framework's."""
    out = []
    if not isinstance(site, dict):
        return out
    for s in [site, site.get("framework")] + list(site.get("callers") or ()):
        f = s.get("file") if isinstance(s, dict) else None
        if isinstance(f, str) and f.startswith("/"):
            out.append(f)
    return out


# --- one file, described (and its bytes, where they may be kept) ------------------------
def describe(path: str, owner: int | None = None) -> tuple[dict, bytes | None]:
    """(manifest entry, bytes to keep or None) for a file as it is now; with `owner`, a
    file of another user is not read."""
    lib = library_of(path)
    if lib is not None:
        return {"library": lib[0], "version": lib[1]}, None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        return {"missing": exc.strerror or str(exc)}, None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return {"missing": "not a regular file"}, None
        if owner is not None and st.st_uid != owner:
            return {"missing": "not the run's user's"}, None
        if st.st_size > HASH_MAX_BYTES:
            return {"size": st.st_size, "why": "too large to hash"}, None
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(HASH_MAX_BYTES + 1)
    except OSError as exc:
        return {"missing": exc.strerror or str(exc)}, None
    finally:
        os.close(fd)
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}, data


def _copy_name(sha: str) -> str:
    return f"{sha}.src"


def empty_manifest() -> dict:
    return {"format": FORMAT, "version": VERSION, "file_bound_bytes": KEEP_FILE_BYTES,
            "run_bound_bytes": KEEP_RUN_BYTES, "kept_bytes": 0, "files": {}}


def place(entry: dict, data: bytes | None, manifest: dict, keep: bool,
           write_copy) -> None:
    """Keep `data` as `entry`'s copy where the bounds allow (write_copy(name, data)), or
    say in the entry why not."""
    if data is None or "sha256" not in entry:
        return
    if not keep:
        entry["why"] = "copies off (--no-source)"
    elif len(data) > KEEP_FILE_BYTES:
        entry["why"] = f"over the {KEEP_FILE_BYTES >> 20} MiB a file"
    elif manifest["kept_bytes"] + len(data) > KEEP_RUN_BYTES:
        entry["why"] = f"over the {KEEP_RUN_BYTES >> 20} MiB a run"
    else:
        name = _copy_name(entry["sha256"])
        kept = {e.get("copy") for e in manifest["files"].values()}
        if name not in kept:
            write_copy(name, data)
            manifest["kept_bytes"] += len(data)
        entry["copy"] = name


# --- the ranks' side: noted on the call-site path, kept by a thread ----------------------
class _Keeper:
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.keep = enabled()
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.seen: set[str] = set()
        self.idle = threading.Event()
        self.idle.set()
        self.thread = threading.Thread(target=self._loop, name="distdoctor-sources",
                                       daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            batch = [self.queue.get()]  # blocks: no polling
            self.idle.clear()
            try:
                while True:
                    batch.append(self.queue.get_nowait())
            except queue.Empty:
                pass
            try:
                paths = [f for site in batch for f in files_of(site)]
                new = [p for p in dict.fromkeys(paths) if p not in self.seen]
                self.seen.update(new)
                if new:
                    self._record(new)
            except Exception:
                pass  # never the job's problem: the run just keeps less
            finally:
                if self.queue.empty():
                    self.idle.set()

    def _record(self, paths: list[str]) -> None:
        d = self.run_dir / DIR
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o755)
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return  # a link or another user's: nothing is written through it
        lock = os.open(d / ".lock", os.O_RDWR | os.O_CREAT | _NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)  # the node's ranks, one at a time
            manifest = read_manifest(self.run_dir) or empty_manifest()
            todo = [p for p in paths if p not in manifest["files"]]
            if not todo or len(manifest["files"]) >= MAX_FILES:
                return
            for p in todo:
                entry, data = describe(p)
                place(entry, data, manifest, self.keep,
                       lambda name, b: write_atomically(str(d / name), b, 0o644))
                manifest["files"][p] = entry
            write_atomically(str(d / MANIFEST),
                             (json.dumps(manifest, indent=1) + "\n").encode(), 0o644)
        finally:
            os.close(lock)  # (and the lock with it)


_keeper: _Keeper | None = None
_keeper_lock = threading.Lock()


def note(ring, site) -> None:
    """A call site seen for the first time by this rank (tracer/sites.py): queued for the
    keeper thread; nothing else happens on the caller's thread. Never raises; nothing
    kept where this thread is inside a writer already (a signal handler's op, whose
    locks are those this call takes: reentry.py)."""
    if not reentry.enter():
        return
    try:
        k = _keeper
        if k is None:
            k = _start(ring)
        if k is not None:
            k.idle.clear()
            k.queue.put(site)
    except Exception:
        pass
    finally:
        reentry.leave()


def _start(ring) -> _Keeper | None:
    global _keeper
    with _keeper_lock:
        if _keeper is None:
            path = getattr(ring, "path", None)
            if not path:
                return None
            _keeper = _Keeper(Path(path).parent.parent)
            import atexit

            # a site first seen just before the end is still kept: a bounded wait, and
            # only while something noted is not written yet
            atexit.register(flush, EXIT_WAIT_S)
        return _keeper


def flush(timeout: float = 1.0) -> bool:
    """Wait (bounded) until the keeper has written what was noted (tests, exit)."""
    k = _keeper
    return True if k is None else k.idle.wait(timeout)


def _after_fork() -> None:  # a forked child has no keeper thread: it starts its own
    global _keeper, _keeper_lock
    _keeper, _keeper_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


# --- the manifest, read back (the keeper's and the readers') ------------------------------
def read_manifest(run_dir: str | os.PathLike) -> dict | None:
    """The run dir's manifest, checked; None when it has none (an older run, or one that
    noted nothing) or it is not readable."""
    data = read_regular(Path(run_dir) / DIR / MANIFEST, MAX_MANIFEST)
    if data is None:
        return None
    try:
        m = parse_json(data)  # (a manifest nested 100,000 deep: ValueError, not a crash)
    except (ValueError, UnicodeDecodeError):
        return None
    if (not isinstance(m, dict) or m.get("format") != FORMAT
            or not isinstance(m.get("version"), int) or m["version"] > VERSION
            or not isinstance(m.get("files"), dict)):
        return None
    if not isinstance(m.get("kept_bytes"), int):
        m["kept_bytes"] = 0
    m["files"] = {p: e for p, e in m["files"].items() if isinstance(e, dict)}
    return m
