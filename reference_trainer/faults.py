"""Fault injection: `--inject KIND:key=val,...` reproduces a classic distributed failure.

Every fault happens at a line of reference_trainer/faults.py, in a function named after
it, so a diagnosis that names "the culprit's line" points there. A rank that injects says so on
stderr when it does (`[rank R] inject ...`), so a test or a person can tell an injected
failure from a real one.

  straggler:rank=R,ms=D[,every=K]  rank R sleeps D ms before its collectives (every K steps)
  mismatch:rank=R,step=S           rank R broadcasts where the others all-reduce
  shape:rank=R,step=S              rank R all-reduces a tensor one element longer
  skip:rank=R,step=S               rank R skips one all-reduce: desync, then hang
  hang:rank=R,step=S               rank R blocks in compute, forever
  crash:rank=R,step=S              rank R is killed (SIGKILL: no cleanup, no traceback)
  slowlink:stage=K,ms=D            the pipeline hop between stage K and K+1 is D ms slower,
                                   both ways (activations K -> K+1, gradients K+1 -> K)
  throttle:rank=R,factor=F         rank R's blocks take F times as long (forward and
                                   backward): a SIMULATED thermally throttled GPU. It sleeps;
                                   it never touches the hardware and never fakes NVML data.

The collective faults (mismatch, shape, skip) replace the step's loss all-reduce, the one
collective every rank issues every step (train.py: `reduce_loss_for_logging`).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

# kind -> (required keys, optional keys with defaults)
KINDS: dict[str, tuple[tuple[str, ...], dict[str, float]]] = {
    "straggler": (("rank", "ms"), {"every": 1}),
    "mismatch": (("rank", "step"), {}),
    "shape": (("rank", "step"), {}),
    "skip": (("rank", "step"), {}),
    "hang": (("rank", "step"), {}),
    "crash": (("rank", "step"), {}),
    "slowlink": (("stage", "ms"), {}),
    "throttle": (("rank", "factor"), {}),
}
COLLECTIVE_FAULTS = ("mismatch", "shape", "skip")
SIMULATED = "SIMULATED: sleeps in place of slow compute; no hardware is throttled, no NVML data faked"


class FaultSpecError(ValueError):
    """A bad --inject value; the message is one line for the user."""


@dataclass(frozen=True)
class Fault:
    kind: str
    params: dict

    def __getattr__(self, key):  # fault.rank, fault.ms, ...
        try:
            return self.params[key]
        except KeyError:
            raise AttributeError(key) from None

    def __str__(self) -> str:
        required, optional = KINDS[self.kind]
        keys = [k for k in (*required, *optional) if k in self.params]
        return self.kind + ":" + ",".join(f"{k}={self.params[k]:g}" for k in keys)


def parse_inject(spec: str) -> Fault:
    kind, _, rest = spec.partition(":")
    if kind not in KINDS:
        raise FaultSpecError(f"--inject {spec!r}: unknown kind {kind!r}; "
                             f"kinds: {', '.join(KINDS)}")
    required, optional = KINDS[kind]
    params: dict = dict(optional)
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise FaultSpecError(f"--inject {spec!r}: expected key=value, got {item!r}")
        if key not in required and key not in optional:
            keys = ", ".join((*required, *optional))
            raise FaultSpecError(f"--inject {spec!r}: unknown key {key!r} for {kind}; keys: {keys}")
        try:
            params[key] = float(value) if key == "factor" else int(value)
        except ValueError:
            raise FaultSpecError(f"--inject {spec!r}: {key}={value!r} is not a number") from None
    missing = [k for k in required if k not in params]
    if missing:
        raise FaultSpecError(f"--inject {spec!r}: {kind} needs {', '.join(missing)}")
    return Fault(kind, params)


def validate(faults: list[Fault], world_size: int, steps: int, num_stages: int) -> None:
    """Reject faults that could never fire on this job (checked on every rank before init)."""
    for f in faults:
        if "rank" in f.params and not 0 <= f.rank < world_size:
            raise FaultSpecError(f"--inject {f}: rank {f.rank} is out of range for "
                                 f"WORLD_SIZE={world_size} (ranks 0..{world_size - 1})")
        if "step" in f.params and not 1 <= f.step <= steps:
            raise FaultSpecError(f"--inject {f}: step {f.step} is outside 1..{steps} (--steps)")
        if "ms" in f.params and f.ms < 0:
            raise FaultSpecError(f"--inject {f}: ms must be >= 0")
        if f.kind == "straggler" and f.every < 1:
            raise FaultSpecError(f"--inject {f}: every must be >= 1")
        if f.kind == "throttle" and f.factor < 1:
            raise FaultSpecError(f"--inject {f}: factor must be >= 1 (1 = full speed)")
        if f.kind == "slowlink":
            if num_stages < 2:
                raise FaultSpecError(f"--inject {f}: slowlink needs pipeline stages (--pp > 1)")
            if not 0 <= f.stage < num_stages - 1:
                raise FaultSpecError(f"--inject {f}: stage {f.stage} has no next stage; "
                                     f"hops are 0..{num_stages - 2} for {num_stages} stages")
    steps_taken = [(f.rank, f.step) for f in faults if f.kind in COLLECTIVE_FAULTS]
    if len(steps_taken) != len(set(steps_taken)):
        raise FaultSpecError("--inject: two collective faults on the same rank and step")


def _say(rank: int, message: str) -> None:
    print(f"[rank {rank}] inject {message}", file=sys.stderr, flush=True)


class FaultInjector:
    """This rank's share of the requested faults, called from the training loop."""

    def __init__(self, faults: list[Fault], rank: int):
        self.rank = rank
        self.mine = [f for f in faults if f.params.get("rank", rank) == rank]
        self.slowlinks = [f for f in faults if f.kind == "slowlink"]
        self._announced: set = set()

    def _at(self, kind: str, step: int) -> Fault | None:
        return next((f for f in self.mine if f.kind == kind and f.step == step), None)

    # --- before the step's first collective ---------------------------------------------------
    def before_step(self, step: int) -> None:
        for f in self.mine:
            if f.kind == "straggler" and step % f.every == 0:
                straggle(self.rank, step, f.ms)
        if self._at("crash", step):
            crash_now(self.rank, step)
        if self._at("hang", step):
            hang_in_compute(self.rank, step)

    # --- the step's loss all-reduce ------------------------------------------------------------
    def replaces_collective(self, step: int) -> bool:
        return any(self._at(kind, step) for kind in COLLECTIVE_FAULTS)

    def faulty_collective(self, buf: torch.Tensor, group, step: int) -> None:
        if self._at("mismatch", step):
            broadcast_instead_of_all_reduce(self.rank, step, buf, group)
        elif self._at("shape", step):
            all_reduce_wrong_length(self.rank, step, buf, group)
        elif self._at("skip", step):
            skip_all_reduce(self.rank, step)

    # --- compute and links ---------------------------------------------------------------------
    def throttle_factor(self) -> float:
        return max((f.factor for f in self.mine if f.kind == "throttle"), default=1.0)

    def attach_throttle(self, model: torch.nn.Module) -> None:
        """Slow this rank's transformer blocks down, if a throttle targets it."""
        factor = self.throttle_factor()
        if factor > 1:
            throttle = Throttle(self.rank, factor)
            for block in model.layers.values():
                throttle.attach(block)
            _say(self.rank, f"throttle x{factor:g}: every block takes {factor:g}x as long "
                            f"({SIMULATED})")

    def link_delay(self, direction: str, stage_index: int) -> None:
        """Called by a pipeline stage just before it sends (see pipeline_parallel.py)."""
        for f in self.slowlinks:
            if (direction, stage_index) in (("forward", f.stage), ("backward", f.stage + 1)):
                if (str(f), direction) not in self._announced:  # once, not per microbatch
                    self._announced.add((str(f), direction))
                    _say(self.rank, f"slowlink: every {direction} send of stage {stage_index} "
                                    f"(hop {f.stage} <-> {f.stage + 1}) leaves {f.ms:g} ms late")
                delay_on_slow_link(f.stage, f.ms)


# --- the faults themselves: one function each, the fault on a line of its own -------------------


def straggle(rank: int, step: int, ms: float) -> None:
    _say(rank, f"straggler at step {step}: {ms:g} ms of extra work before its collectives")
    time.sleep(ms / 1000)  # <- straggler: this rank arrives late at every collective after this


def crash_now(rank: int, step: int) -> None:
    _say(rank, f"crash at step {step}: SIGKILL to itself (pid {os.getpid()})")
    os.kill(os.getpid(), signal.SIGKILL)  # <- crash: the process dies here, mid-job


def hang_in_compute(rank: int, step: int) -> None:
    _say(rank, f"hang at step {step}: blocking in compute forever (hang_in_compute)")
    while True:
        time.sleep(0.05)  # <- hang: stuck "computing"; peers wait in their next collective


def broadcast_instead_of_all_reduce(rank: int, step: int, buf: torch.Tensor, group) -> None:
    _say(rank, f"mismatch at step {step}: broadcast where the others all-reduce")
    dist.broadcast(buf, src=rank, group=group)  # <- mismatch: wrong collective type


def all_reduce_wrong_length(rank: int, step: int, buf: torch.Tensor, group) -> None:
    longer = torch.cat([buf, buf.new_zeros(1)])
    _say(rank, f"shape at step {step}: all-reduce of {longer.numel()} elements, "
               f"the others reduce {buf.numel()}")
    dist.all_reduce(longer, group=group)  # <- shape: same collective, another length


def skip_all_reduce(rank: int, step: int) -> None:
    _say(rank, f"skip at step {step}: skipping the loss all-reduce (desync)")
    return  # <- skip: the all-reduce the others issue at this step is never issued here


def delay_on_slow_link(stage: int, ms: float) -> None:
    time.sleep(ms / 1000)  # <- slowlink: the send over this hop leaves `ms` late


class Throttle:
    """Makes every transformer block of this rank take `factor` times as long.

    Forward: a hook times the block and sleeps (factor - 1) x that long. Backward: two
    identity autograd functions mark where the block's backward starts (at its output) and
    ends (at its input); the end sleeps (factor - 1) x the time in between. Sleeping stands
    in for slow kernels: peers see this rank arrive late at every collective, as they would
    with a throttled GPU. It is a simulation and every message about it says so.
    """

    def __init__(self, rank: int, factor: float):
        self.rank, self.extra = rank, factor - 1.0

    def attach(self, block: torch.nn.Module) -> None:
        state = {"fwd_start": 0.0, "bwd_start": 0.0}
        extra = self.extra

        class _BackwardEnds(torch.autograd.Function):  # applied to the block's input
            @staticmethod
            def forward(ctx, x):
                return x.view_as(x)

            @staticmethod
            def backward(ctx, grad):
                throttled_compute(extra * (time.perf_counter() - state["bwd_start"]))
                return grad

        class _BackwardStarts(torch.autograd.Function):  # applied to the block's output
            @staticmethod
            def forward(ctx, x):
                return x.view_as(x)

            @staticmethod
            def backward(ctx, grad):
                state["bwd_start"] = time.perf_counter()
                return grad

        def pre_hook(module, args):
            state["fwd_start"] = time.perf_counter()
            x = args[0]
            return (_BackwardEnds.apply(x), *args[1:]) if x.requires_grad else None

        def post_hook(module, args, out):
            throttled_compute(extra * (time.perf_counter() - state["fwd_start"]))
            return _BackwardStarts.apply(out)

        block.register_forward_pre_hook(pre_hook)
        block.register_forward_hook(post_hook)


def throttled_compute(seconds: float) -> None:
    time.sleep(max(seconds, 0.0))  # <- throttle (SIMULATED): slow compute stands in for a hot GPU
