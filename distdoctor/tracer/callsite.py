"""Find the user's line that issued a collective.

Walk out from the current frame past torch, distdoctor and the standard library; the
first frame left is the user's. Whether a code object is "internal" is decided once and
cached, so the walk costs a few dictionary look-ups per frame. Ops issued where the
current thread has no user frame (autograd's worker threads run DDP's and FSDP's hooks)
take the main thread's innermost user frame: the line that called `backward()`. Code torch
generates (inductor's wrapper modules) stops the walk, so that each of its collectives
is a site of its own; `tracer/compiled.py` maps it to the user's line.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
import threading
import weakref

import torch


def _package_dir(name: str) -> str | None:
    """Where a subpackage lives without importing it: an editable install maps
    distdoctor.probes and distdoctor.tui to the repo's top-level probes/ and tui/."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


# distdoctor's own directory is this file's parent's parent: importing the package here
# would make the tracer depend on the API that is built on it
_INTERNAL_DIRS = tuple(
    os.path.dirname(p) + os.sep
    for p in (torch.__file__, os.path.dirname(__file__))
) + tuple(
    d + os.sep for d in map(_package_dir, ("distdoctor.probes", "distdoctor.tui")) if d
) + tuple(
    os.path.realpath(d) + os.sep
    for d in {sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")}
    if d
)
# id(code) -> (code, is_internal, the framework it is code of or None). Keyed by id:
# hashing a code object hashes its whole bytecode, which made this look-up the most
# expensive part of a traced call. The code object is kept in the entry, so its id cannot
# be reused while the entry exists. runlog/_fast.c reads the same entries (and remembers
# by address only a code its entry keeps). Code compiled from a string (exec, eval) is
# new at each call of a job that issues its collectives so: its entry keeps a weak
# reference instead and goes with the code (kept, 18,000 exec'd all_reduces held 14 MB a
# rank for good).
# So is a file's code compiled anew for each op (exec of its text, a template per step):
# past MAX_VARIANTS codes of one function (torch.compile's recompiles stay under its
# cache limit, 8), its further codes are held weakly too (held, 10,000 ops took 13 MB).
_internal: dict = {}
_FROM_STRINGS = frozenset({"<string>"})
_MAIN_THREAD_ID = threading.main_thread().ident
MAX_VARIANTS = 16
_variants: dict = {}  # (file, first line, name) -> its codes held in _internal


def _entry(code) -> tuple:
    key = id(code)
    hit = _internal.get(key)
    if hit is None:
        name = code.co_filename
        if name in _FROM_STRINGS:  # (a callback runs before the code's id is free again)
            hit = _internal[key] = (weakref.ref(code, _forgetter(key)), True, None)
        elif _held_enough(code):
            hit = _internal[key] = (weakref.ref(code, _forgetter(key)),
                                    is_internal_file(name), framework_of(name))
        else:
            hit = _internal[key] = (code, is_internal_file(name), framework_of(name))
    return hit


def _held_enough(code) -> bool:
    """Are MAX_VARIANTS codes of `code`'s function held already (or as many functions as
    this table remembers)? If not, counts `code` as held."""
    which = (code.co_filename, code.co_firstlineno, code.co_name)
    held = _variants.get(which, 0)
    if held >= MAX_VARIANTS or (not held and len(_variants) >= 1 << 16):
        return True
    _variants[which] = held + 1
    return False


def _forgetter(key: int, table: dict = _internal):
    """The weak reference's callback that drops `key`'s entry: bound to the table itself,
    since at exit the module's globals may be gone before the code is."""
    return lambda _ref: table.pop(key, None)


def _is_internal(code) -> bool:
    return _entry(code)[1]


def is_internal_file(name: str) -> bool:
    """Code of torch's, distdoctor's, a training framework's or the standard library's,
    or code with no file (`exec`, torch's `_codegen.py:...`). Not an FX graph module's
    `<eval_with_key>` code: the walk stops there, and tracer/compiled.py names the
    user's line its node came from."""
    if name.startswith("<eval_with_key>"):
        return False
    if name.startswith("<") or _is_pseudo_file(name):
        return True
    dirs = _INTERNAL_DIRS + _framework_dirs()
    return (name.startswith(dirs) or os.path.realpath(name).startswith(dirs)) and (
        not _is_bundled_user_code(name))


# Whose code a frame is, by package identity: the top-level packages of torch and of the
# frameworks that issue collectives for the user, wherever they are installed (a user
# site, a PYTHONPATH checkout, a conda env), not only beside the interpreter.
FRAMEWORKS = ("torch", "lightning", "pytorch_lightning", "lightning_fabric", "transformers",
              "accelerate", "deepspeed", "fairscale", "megatron", "apex", "composer",
              "torchmetrics", "peft", "trl", "ray", "torchrec", "torchtune")
_framework_cache: list = [frozenset(), (), ()]  # [names imported, directories, (dir, name)]


def _framework_dirs() -> tuple:
    """The directories of the framework packages imported so far (checked once per
    code object the walk meets for the first time, never per op)."""
    _load_frameworks()
    return _framework_cache[1]


def _load_frameworks() -> None:
    modules = sys.modules
    loaded = frozenset(n for n in FRAMEWORKS if n in modules)
    if loaded != _framework_cache[0]:
        owners = []
        for name in loaded:
            for path in getattr(modules[name], "__path__", None) or ():
                owners += [(d, name) for d in {os.path.join(path, ""),
                                               os.path.join(os.path.realpath(path), "")}]
        _framework_cache[:] = [loaded, tuple(d for d, _ in owners), tuple(owners)]


# The frameworks' names as users know them, for "in Lightning's DDPStrategy.barrier".
FRAMEWORK_NAMES = {"torch": "torch", "lightning": "Lightning", "pytorch_lightning": "Lightning",
                   "lightning_fabric": "Lightning Fabric", "transformers": "HF Transformers",
                   "accelerate": "Accelerate", "deepspeed": "DeepSpeed",
                   "fairscale": "FairScale", "megatron": "Megatron", "apex": "Apex",
                   "composer": "Composer", "torchmetrics": "TorchMetrics", "peft": "PEFT",
                   "trl": "TRL", "ray": "Ray", "torchrec": "TorchRec", "torchtune": "torchtune"}
# torch's own code counts as a framework's where it issues collectives for the user (DDP,
# FSDP, pipelining, DCP, DTensor, DeviceMesh), not where it is the collective API the
# user called (naming `all_reduce` inside `all_reduce` says nothing), nor dynamo's and
# inductor's generated code (tracer/compiled.py maps that to the user's line).
_TORCH_FRAMEWORK = (f"{os.sep}distributed{os.sep}", f"{os.sep}nn{os.sep}parallel{os.sep}")
_TORCH_API = frozenset(f"{os.sep}distributed{os.sep}{f}" for f in (
    "distributed_c10d.py", "c10d_logger.py", "_functional_collectives.py",
    "_functional_collectives_impl.py", "utils.py", "__init__.py"))


def framework_of(name: str) -> str | None:
    """The framework whose code file `name` is ('Lightning', 'torch'...), where that code
    issues collectives on the user's behalf; None for the user's and everything else."""
    if name.startswith("<") or _is_bundled_user_code(name):
        return None
    torch_dir = _INTERNAL_DIRS[0]
    if name.startswith(torch_dir):
        inner = name[len(torch_dir) - 1:]
        return "torch" if inner.startswith(_TORCH_FRAMEWORK) and inner not in _TORCH_API else (
            None)
    _load_frameworks()
    for path in (name, os.path.realpath(name)):
        for d, package in _framework_cache[2]:
            if path.startswith(d) and package != "torch":
                return FRAMEWORK_NAMES.get(package, package)
    return None


def _is_pseudo_file(filename: str) -> bool:
    """A name for code with no file of its own (torch's `_codegen.py:codegen(...)`)."""
    return (not os.path.isabs(filename) and ("(" in filename or ":" in filename)
            and not os.path.exists(filename))


_TEST_CODE = (f"{os.sep}reference_trainer{os.sep}", f"{os.sep}torch{os.sep}testing{os.sep}")


def _is_bundled_user_code(filename: str) -> bool:
    """Code that ships inside torch or distdoctor but plays the user's part: the reference
    trainer, and torch's own test suites (torch.testing._internal.distributed: a test's
    line is the one to name, not the harness that ran it)."""
    return any(part in filename for part in _TEST_CODE)


def user_frame(frame):
    """The innermost non-internal frame at or above `frame`, or None."""
    return user_and_framework_frame(frame)[0]


# How many of the user's frames that called the op's frame are part of its call site, and
# within how many frames they are looked for (runlog/_fast.c walks the same way): a
# helper's barrier called from two places is then two sites, and that is what tells
# where two ranks' paths parted (diagnosis/parting/align.py, diagnosis/parting/branch.py).
CALLERS = 3
CALLER_HOPS = 32


def callers(frame) -> list:
    """Up to CALLERS user frames above the user's frame `frame`, innermost first."""
    out = []
    frame = frame.f_back
    for _ in range(CALLER_HOPS):
        if frame is None or len(out) == CALLERS:
            break
        if not _is_internal(frame.f_code):
            out.append(frame)
        frame = frame.f_back
    return out


def thread_key() -> int:
    """The current thread's ident, 0 on the main thread (the call-site key's 4th item)."""
    ident = threading.get_ident()
    return 0 if ident == _MAIN_THREAD_ID else ident


def thread_name(ident: int) -> str:
    thread = threading._active.get(ident)  # no lock: a dict read under the GIL
    return thread.name if thread is not None else f"thread {ident}"


def find_user_frame():
    """(frame, from_main_thread, framework frame) for the current op; frame may be None.
    The framework frame is the innermost one of a framework's (framework_of) below the
    user's line: Lightning's `DDPStrategy.barrier` under `trainer.fit(...)`."""
    frame, fw = user_and_framework_frame(sys._getframe(2))
    if frame is not None:
        return frame, False, fw
    if threading.get_ident() != _MAIN_THREAD_ID:
        main, main_fw = main_thread_frames()
        if main is not None:
            return main, True, fw or main_fw
    return None, False, None


def user_and_framework_frame(frame) -> tuple:
    """(the innermost user frame at or above `frame`, the innermost framework frame below
    it); either may be None."""
    fw = None
    while frame is not None:
        _, internal, framework = _entry(frame.f_code)
        if not internal:
            return frame, fw
        if fw is None and framework is not None:
            fw = frame
        frame = frame.f_back
    return None, fw


def main_thread_frames() -> tuple:
    """The main thread's innermost user frame (the line that called `backward()` while
    an autograd thread issues DDP's or FSDP's ops) and the innermost framework frame
    below it (Lightning's `backward`); either may be None."""
    return user_and_framework_frame(sys._current_frames().get(_MAIN_THREAD_ID))


def raise_site(tb) -> dict:
    """{file, line, function} of the innermost user frame in a traceback ({} if none)."""
    site = {}
    while tb is not None:
        code = tb.tb_frame.f_code
        if not _is_internal(code):
            site = {"file": code.co_filename, "line": tb.tb_lineno,
                    "function": getattr(code, "co_qualname", code.co_name)}
        tb = tb.tb_next
    return site

