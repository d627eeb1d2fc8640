"""Tensor parallelism with sequence parallelism (Megatron-style), as DTensor plans.

Between blocks a rank holds a slice of the *sequence* (Shard(1)): norms and residual adds
run on 1/tp of the tokens. Attention and FFN need whole sequences, so their input is
all-gathered (Shard(1) -> Replicate), the first matmuls are column-sharded (each rank owns
heads / hidden units), and the last matmul is row-sharded and reduce-scattered straight
back to sequence shards. Per block and direction that is 2 all-gathers + 2 reduce-scatters
of (batch, seq, dim) instead of the 2 all-reduces of plain TP: the same bytes on the wire,
but activations between blocks take 1/tp of the memory.

What it costs: a collective on the critical path of every attention and FFN, so TP belongs
inside a fast link (one NVLink island), never across slow ones.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from ..compat import PrepareModuleInputOutput, Replicate, Shard, parallelize_kwargs


def model_plan() -> dict:
    """Plan for the modules outside the blocks (those a pipeline stage owns)."""
    return {
        # Tokens are replicated; the embedding table is sharded by rows (vocab) and the
        # result is reduce-scattered into sequence shards.
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        # Logits are gathered to every TP rank (Replicate) so the plain cross-entropy works:
        # simple, but it materialises (batch, seq, vocab) per rank. Loss parallelism would
        # keep them vocab-sharded; at vocab 128 it is not worth the complexity.
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }


def block_plan(moe: bool) -> dict:
    """Plan for one TransformerBlock, keyed by submodule name."""
    plan = {
        "attention_norm": SequenceParallel(),
        # (x, rope_cos, rope_sin): gather x to whole sequences; the rope tables stay as-is.
        "attention": PrepareModuleInput(
            input_layouts=(Shard(1), None, None),
            desired_input_layouts=(Replicate(), None, None),
            use_local_output=True,
        ),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
    }
    if moe:
        # Experts are not TP-sharded: every TP rank routes the whole (gathered) sequence and
        # runs the same experts, then keeps its sequence slice (a local chunk, no comm).
        # Redundant compute x tp, traded for a simple plan; experts scale by --ep instead.
        plan["feed_forward"] = PrepareModuleInputOutput(
            input_layouts=(Shard(1),),
            desired_input_layouts=(Replicate(),),
            use_local_input=True,
            output_layouts=(Replicate(),),
            desired_output_layouts=(Shard(1),),
            use_local_output=True,
        )
    else:
        plan.update({
            "feed_forward": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            ),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })
    return plan


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Shard `model` (a whole Transformer or one pipeline stage of it) over `tp_mesh`."""
    top = {name: style for name, style in model_plan().items()
           if getattr(model, name, None) is not None}  # a PP stage may lack some of them
    # src_data_rank=None: every rank built identical weights from the seed, so each keeps
    # its own shard; the default (0) would scatter rank 0's copy, an init-time collective
    # (torch 2.6 and older know no src_data_rank and always scatter: same weights).
    parallelize_module(model, tp_mesh, top, **parallelize_kwargs())
    for block in model.layers.values():
        moe = hasattr(block.feed_forward, "router")
        parallelize_module(block, tp_mesh, block_plan(moe), **parallelize_kwargs())
