"""Every explicit torch.distributed op family, on the default group and a subgroup.

Unmodified script: no distdoctor import. Each op's line carries an `# expect:` marker
that the test compares with the recorded call site.
"""

import os
from contextlib import contextmanager

import torch
import torch.distributed as dist


@contextmanager
def gloo_may_refuse():
    """An op this torch's gloo lacks (the list forms of reduce_scatter and all_to_all in
    torch 2.6 and older, gather_single in 2.15) raises at once on every rank; it is still recorded,
    failed, at its line."""
    try:
        yield
    except RuntimeError as exc:
        if "does not support" not in str(exc):
            raise


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
peer = (rank + 1) % world
prev = (rank - 1) % world
x = torch.arange(4, dtype=torch.float32) + rank

dist.all_reduce(x)  # expect: all_reduce
dist.broadcast(torch.ones(3, dtype=torch.float64), src=0)  # expect: broadcast
dist.reduce(torch.ones(5), dst=0, op=dist.ReduceOp.MAX)  # expect: reduce
dist.all_gather([torch.empty(2) for _ in range(world)], torch.ones(2))  # expect: all_gather
dist.all_gather_into_tensor(torch.empty(2 * world), torch.ones(2))  # expect: all_gather_into_tensor
with gloo_may_refuse():
    dist.reduce_scatter(torch.empty(3), [torch.ones(3) for _ in range(world)])  # expect: reduce_scatter
dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * world))  # expect: reduce_scatter_tensor
with gloo_may_refuse():
    dist.all_to_all([torch.empty(1) for _ in range(world)], [torch.ones(1) for _ in range(world)])  # expect: all_to_all
dist.all_to_all_single(torch.empty(world * 2), torch.ones(world * 2))  # expect: all_to_all_single
dist.gather(torch.ones(6), [torch.empty(6) for _ in range(world)] if rank == 0 else None, dst=0)  # expect: gather
dist.scatter(torch.empty(7), [torch.ones(7) for _ in range(world)] if rank == 0 else None, src=0)  # expect: scatter
if hasattr(dist, "gather_single"):  # torch >= 2.15: one output tensor on the root
    with gloo_may_refuse():  # gloo has no gather_single in torch 2.15
        dist.gather_single(torch.ones(2), torch.empty(2 * world) if rank == 0 else None, dst=0)  # expect: gather_single
dist.barrier()  # expect: barrier
work = dist.all_reduce(torch.ones(8, dtype=torch.int32), async_op=True)  # expect: async_all_reduce
work.wait()
if rank % 2 == 0:
    dist.send(torch.ones(9), dst=peer)  # expect: send
    dist.recv(torch.empty(9), src=prev)  # expect: recv
else:
    dist.recv(torch.empty(9), src=prev)  # expect: recv_odd
    dist.send(torch.ones(9), dst=peer)  # expect: send_odd
ops = [dist.P2POp(dist.isend, torch.ones(10), peer), dist.P2POp(dist.irecv, torch.empty(10), prev)]
for w in dist.batch_isend_irecv(ops):  # expect: batch_isend_irecv
    w.wait()
# a group made by its members alone with use_local_synchronization=True: legal (named by
# its members and by how many groups the rank belongs to, here the same on every rank)
mine = [r for r in range(world) if r % 2 == rank % 2]
side = dist.new_group(mine, use_local_synchronization=True)  # expect: local_group
dist.all_reduce(torch.ones(12), group=side)  # expect: local_all_reduce
sub = dist.new_group([0, 1])  # expect: new_group
if rank in (0, 1):
    dist.all_reduce(torch.ones(11), group=sub)  # expect: subgroup_all_reduce
singles, _ = dist.new_subgroups(group_size=1)  # expect: new_subgroups
everyone = dist.new_group(list(range(world)))  # expect: last_group
dist.all_reduce(torch.ones(13), group=everyone)  # expect: last_all_reduce
dist.barrier()
dist.destroy_process_group()
# torch's own exit race (gloo's worker thread freeing a tensor while the interpreter
# finalizes: SIGABRT, seen untraced on torch 2.6): leave without finalizing (see determinism.py)
os._exit(0)
