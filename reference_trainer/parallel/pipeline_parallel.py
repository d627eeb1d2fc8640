"""Pipeline parallelism with torch.distributed.pipelining: split the layers into stages,
one PipelineStage per stage, and a schedule that interleaves microbatches over them.

  gpipe            all forwards, then all backwards. Simple; holds every microbatch's
                   activations at once, and the bubble is (pp - 1) / (microbatches + pp - 1).
  1f1b             after warm-up each rank alternates one forward, one backward: the same
                   bubble as GPipe but at most pp microbatches of activations in flight.
  interleaved1f1b  two stages per rank (rank i holds stages i and i + pp, "looped"): the
                   bubble shrinks by the number of stages per rank, at the cost of twice
                   as many (smaller) p2p transfers.

Splitting is manual, torchtitan-style: deep-copy the full model once per local stage and
delete what the stage does not own. Layers are kept in a ModuleDict, so names and seed-
derived weights survive. No tracing of the model (the pipe() frontend) is needed.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from ..compat import stage_needs_example_inputs
from .dims import PP_SCHEDULES

# The names are dims.PP_SCHEDULES' (kept there so that flag parsing needs no pipelining import).
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved1f1b": ScheduleInterleaved1F1B}


def stage_ids(pp_rank: int, pp: int, schedule: str) -> list[int]:
    """The stage indices rank `pp_rank` holds ("looped" placement for interleaved)."""
    return [pp_rank + v * pp for v in range(PP_SCHEDULES[schedule])]


def layer_ranges(n_layers: int, num_stages: int) -> list[range]:
    """Contiguous, as even as possible; earlier stages get the spare layers."""
    base, extra = divmod(n_layers, num_stages)
    bounds, start = [], 0
    for s in range(num_stages):
        end = start + base + (1 if s < extra else 0)
        bounds.append(range(start, end))
        start = end
    return bounds


def split_model(model: nn.Module, ids: list[int], num_stages: int) -> list[nn.Module]:
    """One pruned copy of `model` per stage in `ids`."""
    ranges = layer_ranges(len(model.layers), num_stages)
    parts = []
    for sid in ids:
        part = copy.deepcopy(model)
        for name in list(part.layers):
            if int(name) not in ranges[sid]:
                del part.layers[name]
        if sid != 0:
            part.tok_embeddings = None
        if sid != num_stages - 1:
            part.norm, part.output = None, None
        parts.append(part)
    return parts


class FaultyPipelineStage(PipelineStage):
    """A PipelineStage that calls `link_delay(direction, stage_index)` before each send.

    The hook is where `slowlink` injects its delay; without faults it is a no-op call.
    """

    def __init__(self, *args, link_delay: Callable[[str, int], None], **kwargs):
        super().__init__(*args, **kwargs)
        self._link_delay = link_delay

    def get_fwd_send_ops(self, fwd_chunk_id: int):
        ops = super().get_fwd_send_ops(fwd_chunk_id)
        if ops:
            self._link_delay("forward", self.stage_index)
        return ops

    def get_bwd_send_ops(self, bwd_chunk_id: int):
        ops = super().get_bwd_send_ops(bwd_chunk_id)
        if ops:
            self._link_delay("backward", self.stage_index)
        return ops


def build_schedule(
    parts: list[nn.Module],
    ids: list[int],
    num_stages: int,
    pp_mesh,
    device: torch.device,
    schedule: str,
    microbatches: int,
    loss_fn: Callable,
    link_delay: Callable[[str, int], None],
    example_args: Callable[[int], dict] | None = None,
):
    stages = [
        FaultyPipelineStage(part, sid, num_stages, device, group=pp_mesh.get_group(),
                            link_delay=link_delay,
                            **(example_args(sid) if stage_needs_example_inputs() else {}))
        for part, sid in zip(parts, ids, strict=True)
    ]
    # scale_grads=True: the loss is a per-microbatch mean, so gradients summed over
    # microbatches are divided by their number, giving the gradient of the batch mean.
    # torch 2.6 and older have no scale_grads: the loss is divided instead (same
    # gradients), and pipeline_step multiplies the logged loss back.
    cls = SCHEDULES[schedule]
    if "scale_grads" in inspect.signature(cls.__init__).parameters:
        kwargs, scale = {"loss_fn": loss_fn, "scale_grads": True}, 1
    else:
        kwargs, scale = {"loss_fn": lambda out, tgt: loss_fn(out, tgt) / microbatches}, \
            microbatches
    built = cls(stages if schedule == "interleaved1f1b" else stages[0], microbatches, **kwargs)
    built.logged_loss_scale = scale
    return built


def pipeline_step(pp_schedule, ids: list[int], num_stages: int, inputs, targets):
    """Run one training step's forward and backward through the schedule.

    Returns the mean microbatch loss on the rank that holds the last stage, else None.
    """
    has_first, has_last = 0 in ids, num_stages - 1 in ids
    losses: list[torch.Tensor] = []
    args = (inputs,) if has_first else ()
    if has_last:
        pp_schedule.step(*args, target=targets, losses=losses)
        scale = getattr(pp_schedule, "logged_loss_scale", 1)
        return torch.stack([loss.detach() for loss in losses]).mean() * scale
    pp_schedule.step(*args)
    return None
