"""Arming the tracer in a rank process.

`install()` patches `torch.distributed` once torch is imported: every process group
created afterwards (default group, `new_group`, DeviceMesh, `split_group`) is built as a
`TracingProcessGroup`. When the default group appears, the rank's session starts: run
dir agreed, rank metadata written, event log mapped.

`distdoctor run` needs no call in the script: it puts `launch/bootstrap` on PYTHONPATH,
whose `sitecustomize` calls `install_import_hook()` in every Python process it starts.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import os
import socket
import sys
import threading
import time
from pathlib import Path

from distdoctor.runlog import rundir
from distdoctor.tracer import backends, exits, groups, state, support

_C10D = "torch.distributed.distributed_c10d"
# Backend names traced beyond what torch's registry says (traced_backend_names); empty
# in the product: a benchmark adds "fake" to time the tracer without communication.
_BUILTIN_BACKENDS: set = set()
_lock = threading.Lock()
_config = {"run_dir": None, "patched": False, "hooked": False}


def install(run_dir: str | None = None) -> None:
    try:
        if run_dir is not None:
            _config["run_dir"] = str(run_dir)
        if _C10D in sys.modules:
            _patch()
            _warn_if_too_late()
        else:
            install_import_hook()
    except Exception as exc:  # never into user code
        print(f"distdoctor: tracer not installed: {exc!r}", file=sys.stderr)


def _warn_if_too_late() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and state.recorder is None:
        print("distdoctor: install() ran after init_process_group: groups that already "
              "exist are not traced; call it before init_process_group or use "
              "`distdoctor run`", file=sys.stderr)


# --- import hook ------------------------------------------------------------------------
class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Lets torch import distributed_c10d normally, then patches it, once."""

    def find_spec(self, name, path=None, target=None):
        if name != _C10D:
            return None
        sys.meta_path.remove(self)  # find the real spec with the other finders
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            try:
                _patch(module)
            except Exception as exc:
                print(f"distdoctor: tracer not installed: {exc!r}", file=sys.stderr)

        spec.loader.exec_module = exec_and_patch
        return spec


def install_import_hook() -> None:
    with _lock:
        if _config["hooked"] or _config["patched"]:
            return
        _config["hooked"] = True
        sys.meta_path.insert(0, _PatchAfterImport())


# --- the patch ------------------------------------------------------------------------
def _patch(c10d=None) -> None:
    with _lock:
        if _config["patched"]:
            return
        _config["patched"] = True
    if c10d is None:
        c10d = importlib.import_module(_C10D)
    if not getattr(c10d, "is_available", lambda: True)():
        return
    import torch

    if (too_old := support.below_floor(torch.__version__)) is not None:
        print(f"distdoctor: {too_old}; this job runs untraced", file=sys.stderr)
        return
    original = getattr(c10d, "_new_process_group_helper", None)
    if original is None:
        print(f"distdoctor: torch {torch.__version__} has no _new_process_group_helper to "
              "build traced groups with; this job runs untraced", file=sys.stderr)
        return
    from distdoctor.tracer import compiled
    from distdoctor.tracer.process_group import RealProcessGroup, TracingProcessGroup

    compiled.install()  # torch.compile: skip distdoctor's frames, keep the user's lines

    def _new_process_group_helper(*args, **kwargs):
        backend = str(args[3] if len(args) > 3 else kwargs.get("backend", "")).lower()
        if not _traced(c10d, backend):
            return original(*args, **kwargs)  # custom Python backends stay untouched
        is_default = c10d.GroupMember.WORLD is None
        rec = state.recorder
        made = None if is_default or rec is None else groups.creation_begin(rec, args, kwargs)
        c10d.ProcessGroup = TracingProcessGroup
        try:
            pg, store = original(*args, **kwargs)
        except BaseException:
            groups.creation_end(rec, made, True)
            raise
        finally:
            c10d.ProcessGroup = RealProcessGroup
        groups.creation_end(rec, made, False)
        if is_default:  # a new default group (again, after destroy_process_group: a
            # test suite, a notebook) is a new incarnation of this rank, with a new log
            _start_session(pg, backend, args[4] if len(args) > 4 else kwargs.get("store"))
        return pg, store

    c10d._new_process_group_helper = _new_process_group_helper
    from distdoctor.tracer import exact_class

    # where torch tests type(group) is ProcessGroup: exact_class.py says why
    exact_class.patch_batch_isend_irecv(c10d, TracingProcessGroup)
    exact_class.patch_destroy_process_group(c10d, TracingProcessGroup)

    # split_group() calls parent_pg.split_group(), which TracingProcessGroup overrides.


def _traced(c10d, backend: str) -> bool:
    if backend in _BUILTIN_BACKENDS:
        return True
    try:
        return backends.traced_backend(c10d, backend)
    except Exception:
        return False  # torch raises its own error about the name, untraced


# --- the rank's session ---------------------------------------------------------------
def _start_session(pg, backend: str, store) -> None:
    rank = "?"
    try:
        if state.recorder is not None:
            old, state.recorder = state.recorder, None
            old.retire()
            _let_go(old)
        rank, world = pg.rank(), pg.size()
        run_dir = _config["run_dir"] = _agree_run_dir(rank, store)  # kept for a re-init
        _open_recorder(run_dir, rank, world, backend, launch_identity(store, world), pg)
    except Exception as exc:  # (the job goes on untraced: said, with what it costs)
        print(f"distdoctor: tracing disabled on rank {rank}: {exc!r}; its ops are not "
              "recorded, and no hang or mismatch of its can be diagnosed", file=sys.stderr)


def _let_go(rec) -> None:
    """A retired log's incarnation is over: what it holds is given back, or a script that
    makes its default group again and again (a test suite, a sweep, a notebook) runs out
    of descriptors and threads (8 descriptors and a thread kept per group made). The C
    path's last waited work holds its group's gloo context (a socket, an epoll, a pipe
    pair, a thread); the log, its map and two descriptors; the exit hook, the recorder.
    While an op's done-callback may still write to the log, the log stays, until exit.
    Never the new incarnation's problem: whatever fails here is left as it is."""
    try:
        for name in ("begin", "end", "_core"):
            rec.__dict__.pop(name, None)
        rec._pending.close()
        if rec._callbacks_alive:
            return
        atexit.unregister(rec.close)
        rec.ring.close()
    except Exception:
        pass


def launch_identity(store, world: int) -> dict:
    """What the ranks of one launch share and the next launch does not: the store they
    met at (a new port for each torchrun; a new file for each test of a suite), the
    elastic restart count, the world size. Readers group the ranks' logs by it into
    incarnations of the job (runlog.incarnations); nothing is exchanged between ranks."""
    out: dict = {"world": world}
    for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                 "TORCHELASTIC_RESTART_COUNT"):
        if os.environ.get(name):
            out[name.lower()] = os.environ[name]
    try:
        base = store
        while hasattr(base, "underlying_store"):  # PrefixStore("default_pg", ...)
            base = base.underlying_store
        if hasattr(base, "port") and hasattr(base, "host"):
            out["store"] = f"tcp://{base.host}:{base.port}"
        elif getattr(base, "path", None):
            out["store"] = f"file://{base.path}"
        elif base is not None:
            out["store"] = f"{type(base).__name__}@{id(base):x}"  # one process's own store
    except Exception:
        pass
    return out


def _agree_run_dir(rank: int, store) -> str:
    """The run dir: given, from `distdoctor run`, or chosen by rank 0 and shared."""
    chosen = _config["run_dir"] or os.environ.get(rundir.ENV_RUN_DIR)
    key = "distdoctor/run_dir"
    if rank == 0:
        # shared even when given: a rank whose environment lacks it (a launcher that
        # passes variables one by one) waited 10 s for rank 0's word, then traced elsewhere
        chosen = chosen or str(rundir.new_run_dir().resolve())
        if store is not None:
            try:
                store.set(key, chosen)
            except Exception:  # the job's store: never an error of ours in its way
                pass
        return chosen
    if chosen:
        return chosen
    try:  # bounded: a rank 0 without distdoctor must not stall this rank
        from datetime import timedelta

        store.wait([key], timedelta(seconds=10))
        return store.get(key).decode()
    except Exception:
        return str(rundir.new_run_dir(tag=f"rank{rank}").resolve())


def _open_recorder(run_dir: str, rank: int, world: int, backend: str, launch: dict,
                   pg=None) -> None:
    import torch

    from distdoctor.runlog.ring import DEFAULT_RING_MIB, DEFAULT_STRINGS_MIB, RingWriter
    from distdoctor.tracer.recorder import Recorder

    os.makedirs(os.path.join(run_dir, "ranks"), exist_ok=True)
    if rank == 0 and not os.path.exists(os.path.join(run_dir, "run.json")):
        rundir.write_run_meta(run_dir, launcher="install", world_size=world,
                              command=sys.argv)
    ring_mib = float(os.environ.get("DISTDOCTOR_RING_MIB", DEFAULT_RING_MIB))
    ring = RingWriter.next_log(run_dir, rank, int(ring_mib * 2**20),
                               DEFAULT_STRINGS_MIB * 2**20, launch)
    rundir.write_json_atomic(rundir.rank_meta_path(run_dir, rank, ring.log_number), {
        "rank": rank,
        "log_number": ring.log_number,
        "launch": launch,
        "world_size": world,
        "local_rank": _env_int("LOCAL_RANK"),
        "local_world_size": _env_int("LOCAL_WORLD_SIZE"),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "backend": backend,
        # what each device's backend calls itself ("nccl" may build nccl2 or the legacy)
        "backend_names": backends.real_names(pg),
        "torch": torch.__version__,
        "traced_ops": support.traced_ops(),
        "untraceable_ops": support.untraceable_ops(),
        "python": sys.version.split()[0],
        "argv": sys.argv,
        # CUDA is not touched here (that would create a context on GPU 0); the device a
        # rank really uses is in its events' tensor descriptions.
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "clock": {"wall_ns": time.time_ns(), "monotonic_ns": time.monotonic_ns()},
        "ring": {"capacity": ring.capacity, "slot_bytes": 128},
        "restart_count": _env_int("TORCHELASTIC_RESTART_COUNT"),
    })
    state.recorder = Recorder(ring)
    if rank == 0 and (lost := support.untraceable_ops()):
        print(f"distdoctor: torch {torch.__version__}: {', '.join(lost)} cannot be traced "
              "(torch.distributed has it, its ProcessGroup binds no method for it)",
              file=sys.stderr)
    _arm_stack_dump(run_dir, rank)
    _hook_uncaught_exceptions()
    exits.hook_exits()
    if not _config.get("fork_hooked") and hasattr(os, "register_at_fork"):
        # a forked child is not the rank: what it does is not recorded in the rank's log
        os.register_at_fork(after_in_child=_forget_recorder)
        _config["fork_hooked"] = True


def _forget_recorder() -> None:
    state.recorder = None


def _hook_uncaught_exceptions() -> None:
    """Note an uncaught exception in the rank's log before the interpreter reports it
    (and exits): the job's own hook, if any, still runs, after ours."""
    if getattr(sys.excepthook, "_distdoctor", False):
        return
    previous = sys.excepthook

    def excepthook(exc_type, exc, tb):
        rec = state.recorder
        if rec is not None and not issubclass(exc_type, KeyboardInterrupt):
            rec.raised(exc_type, exc, tb)
        previous(exc_type, exc, tb)

    excepthook._distdoctor = True
    sys.excepthook = excepthook


def _arm_stack_dump(run_dir, rank: int) -> None:
    """Let `distdoctor run` get this rank's stacks where py-spy cannot attach: faulthandler
    dumps them to RUN_DIR/stacks/ on SIGUSR2 (only if the job has no handler of its own)."""
    try:
        from distdoctor.probes.stacks import install_stack_dump_handler, keep_stack_dump_handler

        if install_stack_dump_handler(str(Path(run_dir) / "stacks" / f"rank-{rank:05d}.txt")):
            state.recorder.on_heartbeat.append(keep_stack_dump_handler)
    except Exception:
        pass  # no fallback then; py-spy may still work


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None
