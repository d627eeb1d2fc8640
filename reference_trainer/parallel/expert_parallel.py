"""Expert parallelism: each of the `ep` ranks of a group holds n_experts / ep experts, and
tokens travel to their experts and back by all-to-all.

One MoE layer, per microbatch, forward (backward mirrors it with the splits swapped):
  1. all-to-all of per-expert token counts (a handful of int64s), so every rank learns how
     many rows it will receive. On a GPU the split sizes must reach the host: this is a
     CPU-GPU sync point per MoE layer, the price of dropless routing.
  2. dispatch: all-to-all of the routed token rows (uneven splits);
  3. local experts run on rows regrouped by expert;
  4. combine: all-to-all of the results back to the ranks that own the tokens.

EP borrows the data-parallel ranks (see dims.py), so expert weights are not replicated over
"dp" like dense weights: they are replicated only over "dp_mod_ep". They are therefore kept
out of DDP/FSDP and their gradients are reduced here, once per step, over "dp_mod_ep".
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd

from ..model import MoE


class AllToAllDispatcher:
    """Installed as `MoE.dispatcher`: (rows sorted by global expert, counts) -> expert outputs."""

    def __init__(self, experts: nn.Module, group: dist.ProcessGroup, ep: int, n_experts: int):
        self.experts, self.group, self.ep = experts, group, ep
        self.local = n_experts // ep  # experts per rank; rank j owns [j*local, (j+1)*local)

    def __call__(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        ep, local = self.ep, self.local
        # recv_counts[src * local + e]: rows rank `src` sends to my local expert e.
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.group)
        send_splits = counts.view(ep, local).sum(1).tolist()  # host sync (see module doc)
        recv_splits = recv_counts.view(ep, local).sum(1).tolist()
        received = all_to_all_single_autograd(routed, recv_splits, send_splits, self.group)

        # Received rows come grouped by source rank, then expert; regroup by expert.
        local_ids = torch.arange(local, device=recv_counts.device).repeat(ep)
        expert_of_row = torch.repeat_interleave(local_ids, recv_counts)
        order = torch.argsort(expert_of_row, stable=True)
        out = self.experts(received[order], recv_counts.view(ep, local).sum(0).tolist())
        unsorted = torch.empty_like(out).index_copy(0, order, out)

        return all_to_all_single_autograd(unsorted, send_splits, recv_splits, self.group)


def expert_params(model: nn.Module) -> list[nn.Parameter]:
    return [p for m in model.modules() if isinstance(m, MoE) for p in m.experts.parameters()]


def apply_ep(model: nn.Module, ep_mesh, ep: int) -> None:
    """Keep this rank's slice of every MoE layer's experts and route through all-to-all."""
    rank = ep_mesh.get_local_rank()
    for moe in (m for m in model.modules() if isinstance(m, MoE)):
        if moe.n_experts % ep:
            raise ValueError(f"--experts {moe.n_experts} is not divisible by --ep {ep}")
        local = moe.n_experts // ep
        for name, param in list(moe.experts.named_parameters()):
            mine = param.detach()[rank * local:(rank + 1) * local].clone()
            setattr(moe.experts, name, nn.Parameter(mine))
        moe.dispatcher = AllToAllDispatcher(moe.experts, ep_mesh.get_group(), ep, moe.n_experts)


def reduce_expert_grads(params: list[nn.Parameter], dims) -> None:
    """Average expert gradients the way DDP averages dense ones.

    After backward, a rank's expert gradient already sums the contributions of all `ep`
    ranks of its group (the all-to-all backward brought them home). Sum over the replicas
    ("dp_mod_ep") as well and divide by the full data-parallel degree: the result is the
    gradient of the global mean loss, as in a single-process run. One flat all-reduce per
    step for all experts: one collective instead of one per tensor, at the cost of a copy.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    if dims.has_mesh("dp_mod_ep"):
        dist.all_reduce(flat, group=dims.mesh("dp_mod_ep").get_group())
    flat.div_(dims.dp)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
