"""Settings of one sweep, named and defaulted as nccl-tests names them; no torch here.

Sizes take K, M, G (and T) suffixes in powers of 2, like nccl-tests' `-b 8 -e 128M`.
The sweep steps by `-f` (multiply) when it is above 1, else by `-i` (add), from `-b` to
`-e` inclusive. Every check here raises `UserError` with one line a person can act on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field

from distdoctor.errors import UserError
from distdoctor.launch.env import check_nproc

# nccl-tests' type names, in its order, with torch's name and the element size in bytes.
DTYPES: dict[str, tuple[str, int]] = {
    "int8": ("int8", 1), "uint8": ("uint8", 1), "int32": ("int32", 4),
    "uint32": ("uint32", 4), "int64": ("int64", 8), "uint64": ("uint64", 8),
    "half": ("float16", 2), "float": ("float32", 4), "double": ("float64", 8),
    "bfloat16": ("bfloat16", 2),
}
DTYPE_ALIASES = {
    "char": "int8", "int": "int32", "float16": "half", "fp16": "half", "float32": "float",
    "fp32": "float", "float64": "double", "fp64": "double", "bf16": "bfloat16",
}
FLOAT_TYPES = {"half", "float", "double", "bfloat16"}
REDOPS = ["sum", "prod", "max", "min", "avg"]
AVERAGE_NAMES = {0: "rank0", 1: "avg", 2: "min", 3: "max"}
MAX_SIZES = 4096  # a sweep with more sizes than this is a typo (-i 1 up to -e 1G)

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str, what: str = "size") -> int:
    """'8' -> 8, '1K' -> 1024, '32M' -> 33554432, '1.5G' -> 1610612736 (bytes)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UserError(f"invalid {what} {text!r}: use bytes with an optional K, M or G "
                        "suffix, e.g. 8, 64K, 32M, 1G", 2)
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def canonical_dtype(name: str) -> str:
    key = name.strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise UserError(f"unknown datatype {name!r}; choose from {', '.join(DTYPES)} or all", 2)
    return key


def size_sequence(minbytes: int, maxbytes: int, stepfactor: int, stepbytes: int) -> list[int]:
    """The sizes nccl-tests visits: min, then *factor (if > 1) or +step, while <= max."""
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        if len(sizes) > MAX_SIZES:
            raise UserError(f"-b {minbytes} -e {maxbytes} gives more than {MAX_SIZES} sizes; "
                            "use a larger -i or a step factor -f 2", 2)
        size = size * stepfactor if stepfactor > 1 else size + stepbytes
    return sizes


@dataclass
class Options:
    """One `distdoctor nccl-test` invocation, after validation (see `validate`)."""

    ops: list[str] = field(default_factory=lambda: ["all_reduce"])
    minbytes: int = 32 << 20
    maxbytes: int = 32 << 20
    stepbytes: int = 1 << 20
    stepfactor: int = 1
    iters: int = 20
    warmup_iters: int = 5
    check: int = 1
    datatypes: list[str] = field(default_factory=lambda: ["float"])
    redops: list[str] = field(default_factory=lambda: ["sum"])
    root: int = 0  # -1: every root, as nccl-tests' `-r all`
    blocking: int = 0
    average: int = 1
    cudagraph: int = 0
    backend: str = "auto"
    nproc: int | None = None
    json_path: str | None = None
    csv_path: str | None = None
    plot_path: str | None = None
    pairwise: bool = False
    slow_fraction: float = 0.7  # pairs / split groups below this x median are flagged
    split: str | None = None
    explicit_datatypes: bool = False  # -d named types (not `all`): unsupported is an error
    explicit_redops: bool = False  # -o named ops (not `all`): a refused one is an error

    @property
    def sizes(self) -> list[int]:
        return size_sequence(self.minbytes, self.maxbytes, self.stepfactor, self.stepbytes)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Options:
        return cls(**json.loads(text))


def parse_ops(names: list[str], known: list[str]) -> list[str]:
    """Positional op names; `all` expands to every op; a `_perf` suffix is accepted."""
    ops: list[str] = []
    for name in names or ["all_reduce"]:
        key = name.strip().lower().replace("-", "_")
        key = key[: -len("_perf")] if key.endswith("_perf") else key
        key = {"alltoall": "all_to_all", "allreduce": "all_reduce", "allgather": "all_gather",
               "reducescatter": "reduce_scatter"}.get(key, key)
        if key == "all":
            ops.extend(op for op in known if op not in ops)
        elif key in known:
            if key not in ops:
                ops.append(key)
        else:
            raise UserError(f"unknown op {name!r}; choose from {', '.join(known)} or all", 2)
    return ops


def parse_datatypes(text: str) -> tuple[list[str], bool]:
    if text.strip().lower() == "all":
        return list(DTYPES), False
    return [canonical_dtype(part) for part in text.split(",") if part.strip()], True


def parse_redops(text: str) -> tuple[list[str], bool]:
    if text.strip().lower() == "all":
        return list(REDOPS), False
    out = []
    for part in text.split(","):
        key = part.strip().lower()
        if key not in REDOPS:
            hint = " (nccl-tests' mulsum has no torch.distributed equivalent)" \
                if key in ("mulsum", "premulsum") else ""
            raise UserError(f"unknown reduction op {part.strip()!r}; choose from "
                            f"{', '.join(REDOPS)} or all{hint}", 2)
        out.append(key)
    return out, True


def validate(opts: Options) -> Options:
    """Reject settings nccl-tests would reject, and the combinations that cannot work."""
    if opts.pairwise:  # one message size, -e; the sweep's sizes do not apply
        opts.minbytes = opts.maxbytes
    if opts.minbytes > opts.maxbytes:
        raise UserError(f"invalid sizes: minbytes {opts.minbytes} > maxbytes {opts.maxbytes} "
                        "(-b must not exceed -e)", 2)
    if opts.stepfactor < 1:
        raise UserError("-f/--stepfactor must be at least 1 (1 = step by -i bytes)", 2)
    if opts.stepfactor == 1 and opts.stepbytes <= 0 and opts.minbytes != opts.maxbytes:
        raise UserError("-i/--stepbytes must be positive when -f is 1", 2)
    if opts.stepfactor > 1 and opts.minbytes == 0:
        raise UserError("-b must be above 0 with a step factor (0 times -f stays 0)", 2)
    if opts.iters < 1:
        raise UserError("-n/--iters must be at least 1", 2)
    if opts.warmup_iters < 0 or opts.check < 0 or opts.cudagraph < 0:
        raise UserError("-w, -c and -G take a count of 0 or more", 2)
    if opts.average not in AVERAGE_NAMES:
        raise UserError("-a/--average takes 0 (rank 0), 1 (mean), 2 (min) or 3 (max)", 2)
    if opts.blocking not in (0, 1):
        raise UserError("-z/--blocking takes 0 or 1", 2)
    if opts.root < -1:
        raise UserError("-r/--root takes a rank (0 or more) or all", 2)
    if why := check_nproc(opts.nproc, "nccl-test"):
        raise UserError(why, 2)
    if opts.pairwise and opts.split:
        raise UserError("--pairwise and --split do not combine: pairwise already tests "
                        "every pair on its own", 2)
    if not 0.0 < opts.slow_fraction < 1.0:
        raise UserError("--slow-fraction is a fraction of the median, between 0 and 1", 2)
    if opts.plot_path and not opts.plot_path.lower().endswith(".png"):
        raise UserError(f"--plot writes a PNG: give a file name ending in .png, not "
                        f"{opts.plot_path!r}", 2)
    if opts.backend == "gloo" and opts.cudagraph:
        raise UserError("-G/--cudagraph needs CUDA and the nccl backend; gloo has no graphs", 2)
    for flag, path in (("--json", opts.json_path), ("--csv", opts.csv_path),
                       ("--plot", opts.plot_path)):
        if path is not None and not path.strip():  # (an empty name wrote nothing, said nothing)
            raise UserError(f"{flag} needs a file name", 2)
        parent = os.path.dirname(os.path.abspath(path)) if path else None
        if parent and not os.path.isdir(parent):
            raise UserError(f"{flag} {path}: directory {parent} does not exist", 2)
    opts.sizes  # noqa: B018 - raises UserError on a runaway size list
    return opts
