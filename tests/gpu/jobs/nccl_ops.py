"""Every torch.distributed op family on NCCL, each op timed by CUDA events.

Unmodified script (no distdoctor import), run under `distdoctor run --nproc N`. Each op's
line carries an `# expect:` marker: the test compares the recorded call site with it, and
the recorded completion time with the CUDA events' time of the same op.

Each timed op, REPS times: a barrier (the tracer sees a CUDA op's completion when the next
op enters: this barrier), the start event, the op, the end event, and the host waits for
the end event. At the end each rank prints `CUDA_MS {"rank": R, "ms": {NAME: [...]}}`.

    distdoctor run --nproc 1 -- tests/gpu/jobs/nccl_ops.py [REPS]
"""

import json
import os
import sys

import torch
import torch.distributed as dist

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
COUNT = 16 << 20  # elements: 64 MiB of float32, so that each op takes the GPU a while

local_rank = int(os.environ["LOCAL_RANK"])
device = torch.device("cuda", local_rank)
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
rank, world = dist.get_rank(), dist.get_world_size()
peer, prev = (rank + 1) % world, (rank - 1) % world
chunk = COUNT // world
big = torch.ones(COUNT, device=device)
sub = dist.new_group(list(range(world)))


def empty(n: int = COUNT) -> torch.Tensor:
    return torch.empty(n, device=device)


def all_reduce():
    dist.all_reduce(big)  # expect: all_reduce


def broadcast():
    dist.broadcast(big, src=0)  # expect: broadcast


def reduce():
    dist.reduce(big, dst=0, op=dist.ReduceOp.MAX)  # expect: reduce


def all_gather():
    dist.all_gather([empty(chunk) for _ in range(world)], big[:chunk])  # expect: all_gather


def all_gather_into_tensor():
    dist.all_gather_into_tensor(empty(chunk * world), big[:chunk])  # expect: all_gather_into_tensor


def reduce_scatter():
    dist.reduce_scatter(empty(chunk), list(big[:chunk * world].split(chunk)))  # expect: reduce_scatter


def reduce_scatter_tensor():
    dist.reduce_scatter_tensor(empty(chunk), big[:chunk * world])  # expect: reduce_scatter_tensor


def all_to_all():
    dist.all_to_all(list(empty(chunk * world).split(chunk)), list(big[:chunk * world].split(chunk)))  # expect: all_to_all


def all_to_all_single():
    dist.all_to_all_single(empty(chunk * world), big[:chunk * world])  # expect: all_to_all_single


def gather():
    dist.gather(big[:chunk], [empty(chunk) for _ in range(world)] if rank == 0 else None, dst=0)  # expect: gather


def scatter():
    dist.scatter(empty(chunk), list(big[:chunk * world].split(chunk)) if rank == 0 else None, src=0)  # expect: scatter


def async_all_reduce():
    dist.all_reduce(big, async_op=True).wait()  # expect: async_all_reduce


def subgroup_all_reduce():
    dist.all_reduce(big, group=sub)  # expect: subgroup_all_reduce


TIMED = [all_reduce, broadcast, reduce, all_gather, all_gather_into_tensor, reduce_scatter,
         reduce_scatter_tensor, all_to_all, all_to_all_single, gather, scatter,
         async_all_reduce, subgroup_all_reduce]
cuda_ms: dict[str, list[float]] = {}
failed: dict[str, str] = {}
for op in TIMED:
    for _ in range(REPS):
        dist.barrier()  # expect: barrier
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        try:
            op()
        except RuntimeError as exc:  # recorded failed at its line; the test names it
            failed[op.__name__] = str(exc).splitlines()[0]
            break
        end.record()
        end.synchronize()
        cuda_ms.setdefault(op.__name__, []).append(start.elapsed_time(end))

if world > 1:  # torch refuses a send to oneself: point-to-point needs a peer
    if rank % 2 == 0:
        dist.send(big[:chunk], dst=peer)  # expect: send
        dist.recv(empty(chunk), src=prev)  # expect: recv
    else:
        dist.recv(empty(chunk), src=prev)  # expect: recv_odd
        dist.send(big[:chunk], dst=peer)  # expect: send_odd
    ops = [dist.P2POp(dist.isend, big[:chunk], peer), dist.P2POp(dist.irecv, empty(chunk), prev)]
    for w in dist.batch_isend_irecv(ops):  # expect: batch_isend_irecv
        w.wait()
dist.barrier()  # the last timed op's completion is seen here
torch.cuda.synchronize()
print("CUDA_MS " + json.dumps({"rank": rank, "ms": cuda_ms, "failed": failed}), flush=True)
dist.destroy_process_group()
