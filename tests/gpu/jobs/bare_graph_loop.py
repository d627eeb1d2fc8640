"""The bare loop `nccl-test -G` is held against: the same ops written directly against
torch.distributed, -n ops captured in a CUDA graph and the graph replayed -G times.

One rank per GPU with torchrun's environment (the test gives it). Prints
`BARE {"all_reduce": {SIZE: us_per_op}, "all_gather": {...}}`: all_reduce in place,
all_gather out of place (the forms `nccl-test` reports for them on one rank).

    python tests/gpu/jobs/bare_graph_loop.py SIZES ITERS GRAPHS WARMUP
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

sizes = [int(s) for s in sys.argv[1].split(",")]
iters, graphs, warmup = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
world = dist.get_world_size()


def issue(op: str, count: int):
    """Buffers and a function that starts the op the plainest way."""
    if op == "all_reduce":
        buf = torch.ones(count, device=device)
        return lambda: dist.all_reduce(buf, async_op=True)
    chunk = (count // world) // 4 * 4
    recv, send = torch.empty(chunk * world, device=device), torch.ones(chunk, device=device)
    return lambda: dist.all_gather_into_tensor(recv, send, async_op=True)


def us_per_op(start_op) -> float:
    for _ in range(warmup):
        start_op().wait()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        for _ in range(iters):
            start_op().wait()
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(graphs):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / (iters * graphs) * 1e6


out = {op: {str(size): us_per_op(issue(op, size // 4)) for size in sizes}
       for op in ("all_reduce", "all_gather")}
if dist.get_rank() == 0:
    print("BARE " + json.dumps(out), flush=True)
dist.destroy_process_group()
