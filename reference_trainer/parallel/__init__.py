"""Parallelisms, one module each, applied by `parallelize` in a fixed order.

Pipeline splitting (pipeline_parallel.py) happens before: `parallelize` sees one stage.
"""

from __future__ import annotations

from torch import nn

from .dims import ParallelDims, ParallelDimsError

__all__ = ["ParallelDims", "ParallelDimsError", "parallelize"]


def parallelize(model: nn.Module, dims: ParallelDims, activation_checkpointing: bool) -> nn.Module:
    """Apply TP, EP, activation checkpointing and data parallelism to `model` (the whole
    model or one pipeline stage). Returns the module to call: the model itself, or its DDP
    wrapper."""
    # 1. Tensor parallel first: it turns weights into DTensors on the "tp" axis. FSDP then
    #    shards those DTensors again on its own axis (2-D). In the other order TP would
    #    find FSDP's flat shards instead of the Linear weights its plan names.
    if dims.tp_enabled:
        from .tensor_parallel import apply_tp

        apply_tp(model, dims.mesh("tp"))

    # 2. Expert parallel: keep this rank's experts, route tokens by all-to-all. The expert
    #    weights now differ across "ep" ranks, so they leave data parallelism (step 4).
    ignored: set = set()
    if dims.ep_enabled:
        from .expert_parallel import apply_ep, expert_params

        apply_ep(model, dims.mesh("ep"), dims.ep)
        ignored = set(expert_params(model))

    # 3. Activation checkpointing: each block keeps only its input and recomputes the rest
    #    in backward (~1/3 more compute, activation memory / n_layers). Wrapped before FSDP
    #    so FSDP's per-block hooks also cover the recomputation's all-gathers.
    if activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper,
        )

        for name, block in list(model.layers.items()):
            model.layers[name] = checkpoint_wrapper(block, preserve_rng_state=False)

    # 4. Data parallel last: it wraps or shards whatever the steps above produced.
    #    Under PP, keep weights gathered between microbatches (reshard_after_forward=False):
    #    resharding would repeat every block's all-gather once per microbatch.
    if dims.fsdp_enabled:
        from .data_parallel import apply_fsdp

        mesh = dims.mesh("hsdp") if dims.dp_replicate > 1 else dims.mesh("dp_shard")
        apply_fsdp(model, mesh, reshard_after_forward=not dims.pp_enabled, ignored=ignored)
    elif dims.dp_replicate > 1 and (dims.tp_enabled or dims.pp_enabled):
        from .data_parallel import apply_replicate

        apply_replicate(model, dims.mesh("dp_replicate"), ignored)
    elif dims.dp_replicate > 1:
        from .data_parallel import apply_ddp

        return apply_ddp(model, dims.mesh("dp_replicate"), ignored)
    return model
