"""Command-line flags of the reference trainer, and their validation.

Everything a user can get wrong is checked here, before any process group exists, and
reported as one line (UsageError) instead of a traceback or a hang.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from . import faults as _faults
from .faults import Fault, parse_inject, validate
from .model import ModelArgs
from .parallel.dims import PP_SCHEDULES, ParallelDims

EP_HELP = (
    "expert-parallel degree (needs --experts). EP borrows the data-parallel ranks, as "
    "torchtitan does: it is not a mesh axis of its own and uses no extra ranks. The "
    "--dp x --fsdp data-parallel ranks are viewed as (dp / ep) x ep; each group of ep "
    "ranks splits the experts and swaps tokens by all-to-all, while dense weights stay "
    "data-parallel over all of them. So --ep must divide --dp x --fsdp, and "
    "--dp x --fsdp x --tp x --pp must equal the world size"
)


DEFAULT_LR = {"adamw": 3e-3, "sgd": 0.5}


class UsageError(Exception):
    """A flag combination that cannot run; str() is the one line shown to the user."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        raise UsageError(message)


@dataclass
class TrainConfig:
    model: ModelArgs
    dims: ParallelDims
    schedule: str = "1f1b"
    microbatches: int = 0  # 0: one per pipeline stage
    steps: int = 20
    batch_size: int = 8
    optimizer: str = "adamw"
    lr: float = 0.0  # 0: the optimizer's default (DEFAULT_LR)
    seed: int = 0
    activation_checkpointing: bool = False
    timeout_s: float = 60.0
    device: str = "auto"
    log_every: int = 1
    faults: list[Fault] = field(default_factory=list)

    @property
    def num_stages(self) -> int:
        return self.dims.pp * PP_SCHEDULES[self.schedule] if self.dims.pp_enabled else 1


def build_parser(description: str = "") -> argparse.ArgumentParser:
    p = _Parser(prog="python -m distdoctor.reference_trainer", description=description,
                epilog=_faults.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    par = p.add_argument_group("parallelism (degrees multiply to the world size)")
    par.add_argument("--dp", type=int, default=1, help="data-parallel replicas (DDP)")
    par.add_argument("--fsdp", type=int, default=1,
                     help="FSDP2 shards; with --dp > 1 this is HSDP (replicate x shard)")
    par.add_argument("--tp", type=int, default=1, help="tensor-parallel degree, with sequence "
                     "parallelism (needs --heads, --seq-len, --vocab divisible by it)")
    par.add_argument("--pp", type=int, default=1, help="pipeline-parallel stages (ranks)")
    par.add_argument("--ep", type=int, default=1, help=EP_HELP)
    par.add_argument("--cp", type=int, default=1, help="context parallel: must be 1 (torch's "
                     "ring attention supports only CUDA SDPA kernels)")
    par.add_argument("--schedule", choices=list(PP_SCHEDULES), default="1f1b",
                     help="pipeline schedule (default 1f1b); interleaved1f1b puts 2 stages "
                     "on each rank")
    par.add_argument("--microbatches", type=int, default=0,
                     help="pipeline microbatches per step (default: number of stages)")
    par.add_argument("--ac", action="store_true", help="activation checkpointing per block")

    m = p.add_argument_group("model and data")
    m.add_argument("--layers", type=int, default=4)
    m.add_argument("--dim", type=int, default=64)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--seq-len", type=int, default=32)
    m.add_argument("--vocab", type=int, default=128)
    m.add_argument("--ffn-mult", type=int, default=2, help="FFN hidden size = ffn-mult x dim")
    m.add_argument("--experts", type=int, default=0,
                   help="MoE experts per layer (0: dense FFN)")
    m.add_argument("--top-k", type=int, default=2, help="experts per token")

    t = p.add_argument_group("training")
    t.add_argument("--steps", type=int, default=20)
    t.add_argument("--batch-size", type=int, default=8,
                   help="global batch in sequences, split over data-parallel ranks")
    t.add_argument("--optimizer", choices=sorted(DEFAULT_LR), default="adamw",
                   help="adamw (default), or sgd: plain SGD is sensitive to gradient scale, "
                   "which Adam normalises away, so the correctness tests use it")
    t.add_argument("--lr", type=float, default=0.0,
                   help="learning rate (default: 3e-3 for adamw, 0.5 for sgd)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: CUDA + NCCL when a GPU is visible, else CPU + gloo")
    t.add_argument("--timeout-s", type=float, default=60.0,
                   help="process-group timeout: a hung collective fails after this long")
    t.add_argument("--log-every", type=int, default=1)
    t.add_argument("--inject", action="append", default=[], metavar="KIND:key=val,...",
                   help="inject a fault (repeatable); kinds: straggler, mismatch, shape, "
                   "skip, hang, crash, slowlink, throttle (described below)")
    return p


def parse_config(argv: list[str], world_size: int, description: str = "") -> TrainConfig:
    """Parse and validate; raises UsageError with one line for the user."""
    a = build_parser(description).parse_args(argv)
    try:
        model = ModelArgs(vocab_size=a.vocab, dim=a.dim, n_layers=a.layers, n_heads=a.heads,
                          seq_len=a.seq_len, ffn_mult=a.ffn_mult, n_experts=a.experts,
                          top_k=a.top_k)
        model.validate()
        dims = ParallelDims(dp_replicate=a.dp, dp_shard=a.fsdp, cp=a.cp, tp=a.tp, pp=a.pp,
                            ep=a.ep, world_size=world_size)
        cfg = TrainConfig(model=model, dims=dims, schedule=a.schedule,
                          microbatches=a.microbatches, steps=a.steps, batch_size=a.batch_size,
                          optimizer=a.optimizer, lr=a.lr or DEFAULT_LR[a.optimizer], seed=a.seed, activation_checkpointing=a.ac,
                          timeout_s=a.timeout_s, device=a.device, log_every=a.log_every,
                          faults=[parse_inject(s) for s in a.inject])
        if not cfg.microbatches:
            cfg.microbatches = cfg.num_stages
        _check_shapes(cfg)
        if world_size > 1:
            from .compat import missing_for

            if (missing := missing_for(dims, device_type(a.device), a.schedule)) is not None:
                raise ValueError(missing)
        validate(cfg.faults, world_size, cfg.steps, cfg.num_stages if dims.pp_enabled else 1)
    except ValueError as exc:  # ParallelDimsError, FaultSpecError, shape errors
        raise UsageError(str(exc)) from None
    return cfg


def device_type(flag: str) -> str:
    """--device auto|cpu|cuda as the device type the job will use."""
    if flag != "auto":
        return flag
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _check_shapes(cfg: TrainConfig) -> None:
    m, d = cfg.model, cfg.dims
    checks = [
        (cfg.steps >= 1 and cfg.batch_size >= 1 and cfg.log_every >= 1,
         "--steps, --batch-size and --log-every must be >= 1"),
        (cfg.timeout_s > 0, "--timeout-s must be > 0"),
        (cfg.batch_size % d.dp == 0,
         f"--batch-size {cfg.batch_size} is not divisible by the {d.dp} data-parallel ranks"),
        (m.n_heads % d.tp == 0, f"--heads {m.n_heads} is not divisible by --tp {d.tp}"),
        (m.seq_len % d.tp == 0,
         f"--seq-len {m.seq_len} is not divisible by --tp {d.tp} (sequence parallelism)"),
        (m.vocab_size % d.tp == 0, f"--vocab {m.vocab_size} is not divisible by --tp {d.tp}"),
        (not d.ep_enabled or m.n_experts > 0, "--ep needs an MoE model: add --experts N"),
        (not d.ep_enabled or m.n_experts % d.ep == 0,
         f"--experts {m.n_experts} is not divisible by --ep {d.ep}"),
    ]
    if d.pp_enabled:
        local = cfg.batch_size // max(d.dp, 1)
        checks += [
            (m.n_layers >= cfg.num_stages,
             f"--layers {m.n_layers} is fewer than the {cfg.num_stages} pipeline stages"),
            (cfg.microbatches >= 1 and local % cfg.microbatches == 0,
             f"the per-rank batch ({local} = --batch-size / data-parallel ranks) is not "
             f"divisible by --microbatches {cfg.microbatches}"),
            (cfg.schedule == "gpipe" or cfg.microbatches >= d.pp,
             f"--schedule {cfg.schedule} needs --microbatches >= --pp ({d.pp})"),
            (cfg.schedule != "interleaved1f1b"
             or cfg.microbatches % max(1, cfg.microbatches // d.pp) == 0,
             f"--microbatches {cfg.microbatches} must be a multiple of the interleaved "
             "schedule's rounds (microbatches // pp)"),
        ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


# Every parallel mode of the trainer, smallest layout each: name -> (ranks, degree flags).
# The one list tests and benchmarks run the modes from (stragglers, torch versions).
PARALLEL_MODES = {
    "DDP": (2, ["--dp", "2"]),
    "FSDP2": (2, ["--fsdp", "2"]),
    "HSDP": (4, ["--dp", "2", "--fsdp", "2"]),
    "TP+SP": (2, ["--tp", "2"]),
    "PP gpipe": (2, ["--pp", "2", "--schedule", "gpipe"]),
    "PP 1f1b": (2, ["--pp", "2", "--schedule", "1f1b"]),
    "PP interleaved": (2, ["--pp", "2", "--schedule", "interleaved1f1b"]),
    "DP x PP": (4, ["--dp", "2", "--pp", "2"]),
    "DP x TP": (4, ["--dp", "2", "--tp", "2"]),
    "DDP+EP": (2, ["--dp", "2", "--experts", "4", "--ep", "2"]),
    "8-rank": (8, ["--dp", "2", "--tp", "2", "--pp", "2", "--experts", "4", "--ep", "2"]),
}


def demo_degrees(world_size: int) -> list[str]:
    """Degree flags that exercise as many parallelisms as `world_size` ranks allow on the
    installed torch.

    8 ranks: DP x TP x PP with an MoE over EP (every traffic pattern: all-reduce,
    all-gather / reduce-scatter, p2p, all-to-all). Fewer: DP x PP, then DP alone. A torch
    that cannot run a layout (compat.missing_for) gets the next one. The global batch gives
    each data-parallel rank 4 sequences (2 pipeline microbatches of 2).
    """
    from .compat import missing_for

    candidates = []
    if world_size % 8 == 0:
        candidates.append((world_size // 4, ["--tp", "2", "--pp", "2", "--experts", "4",
                                              "--ep", "2"]))
    if world_size % 4 == 0:
        candidates.append((world_size // 2, ["--pp", "2"]))
    candidates.append((world_size, []))
    device = device_type("auto")
    for dp, rest in candidates:
        flags = {f: int(v) for f, v in zip(rest[::2], rest[1::2], strict=True)
                 if f in ("--tp", "--pp", "--ep")}
        dims = ParallelDims(dp_replicate=dp, tp=flags.get("--tp", 1), pp=flags.get("--pp", 1),
                            ep=flags.get("--ep", 1), world_size=world_size)
        if missing_for(dims, device, "1f1b") is None:
            return ["--dp", str(dp), *rest, "--batch-size", str(4 * dp)]
    return ["--dp", str(world_size), "--batch-size", str(4 * world_size)]


def launch_env() -> dict:
    """torchrun's environment contract, or a single process when it is absent."""
    env = os.environ
    try:
        launched = {"distributed": "WORLD_SIZE" in env, "rank": int(env.get("RANK", 0)),
                    "world_size": int(env.get("WORLD_SIZE", 1)),
                    "local_rank": int(env.get("LOCAL_RANK", 0))}
    except ValueError as exc:
        raise UsageError(f"bad torchrun environment: {exc}") from None
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in env]
    if launched["distributed"] and missing:
        raise UsageError(f"WORLD_SIZE is set but {', '.join(missing)} not: launch with "
                         "torchrun or `distdoctor run --nproc N`")
    return launched
