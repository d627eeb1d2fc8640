"""Data parallelism: DDP, FSDP2 (`fully_shard`) and HSDP, applied last, around what TP built.

  --dp N           DDP: full replicas; gradients all-reduced in buckets while backward runs.
  --fsdp N         FSDP2: parameters, gradients and optimizer state sharded N ways; each
                   block's weights are all-gathered before its forward and backward, its
                   gradients reduce-scattered after its backward.
  --dp R --fsdp S  HSDP: FSDP within groups of S ranks, replicas across the R groups
                   (reduce-scatter inside, all-reduce across): sharding stays on fast
                   links, only 1/S of the gradient crosses the slow ones.

With TP or PP, `--dp` uses the FSDP2-based `replicate` instead of DDP (torchtitan, too,
keeps DDP to 1-D meshes): DDP's reducer cannot hold DTensor parameters (its init broadcast
fails: "c10d.broadcast_ has no sharding strategy"), and under a pipeline schedule several
microbatch backwards per step break its bucket rebuild ("rebuilt parameter indices size is
not same as original model parameters size"). The wire traffic is the same kind (gradient
all-reduce), issued per block instead of per bucket.
"""

from __future__ import annotations

import warnings

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..compat import fully_shard, no_forward_buffer_sync

# Small buckets so that even this tiny model produces several overlapping all-reduces in
# backward, as a real model does with the default 25 MB. Costs launch overhead per bucket.
DDP_BUCKET_MB = 0.25

# Under TP the logits leave the model as DTensor.to_local() views, and FSDP2 warns that an
# in-place op on a view would skip its backward hook. The loss never edits logits in place.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


def _names_of(model: nn.Module, params: set) -> list[str]:
    return [name for name, p in model.named_parameters() if p in params]


def apply_ddp(model: nn.Module, dp_mesh, ignored: set) -> nn.Module:
    """Wrap in DDP over the replicas. Returns the wrapper, which must be the one called."""
    if ignored:
        # Expert weights are sharded by EP, not replicated: DDP must not average them.
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, _names_of(model, ignored)
        )
    return DistributedDataParallel(
        model,
        process_group=dp_mesh.get_group(),
        bucket_cap_mb=DDP_BUCKET_MB,
        # The rope tables are constants: syncing buffers would add a broadcast per forward
        # for nothing (they are still synced once, at init).
        **no_forward_buffer_sync(),
    )


def apply_fsdp(model: nn.Module, dp_mesh, reshard_after_forward: bool, ignored: set) -> None:
    """Shard every block, then the root (embeddings, final norm, output) as one more unit.

    Per-block units let FSDP prefetch block i+1's all-gather while block i computes, and
    free each block's full weights right after use: peak memory ~ one block's weights.
    """
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward,
                    **_ignoring(ignored & set(block.parameters())))
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward,
                **_ignoring(ignored))


def _ignoring(params: set) -> dict:
    """fully_shard's ignored_params only where there are some: torch 2.6 and older have no
    such argument (and refuse --ep beside --fsdp, compat.missing_for)."""
    return {"ignored_params": params} if params else {}


def apply_replicate(model: nn.Module, dp_mesh, ignored: set) -> None:
    """DDP semantics on FSDP2 machinery, for models whose weights are DTensors (TP)."""
    from ..compat import replicate

    for block in model.layers.values():
        replicate(block, mesh=dp_mesh, **_ignoring(ignored & set(block.parameters())))
    replicate(model, mesh=dp_mesh, **_ignoring(ignored))
