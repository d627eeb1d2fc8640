"""The check's job, one process per rank: `python -m distdoctor.check.rank`.

Started by `distdoctor check` (locally, or in place of the training script in the job's
own torchrun line), or by any launcher that sets torchrun's variables (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Every rank gathers its facts; the node's GPUs are
read by its local rank 0; the ranks test their links; everything reaches every rank, and
each node's local rank 0 writes it as JSON to $DISTDOCTOR_CHECK_OUT (one file per node,
so every node's `check` prints the whole job).
"""

from __future__ import annotations

import json
import os
import sys
import time

OUT_ENV = "DISTDOCTOR_CHECK_OUT"
CHECKPOINT_ENV = "DISTDOCTOR_CHECK_CHECKPOINT_DIR"
SWEEP_ENV = "DISTDOCTOR_CHECK_SWEEP"  # "0": skip the pairwise sweep


def main() -> int:
    import torch
    import torch.distributed as dist

    from distdoctor.check import facts, kernel_xids, links

    mine = facts.gather(os.environ.get(CHECKPOINT_ENV))
    if mine["local_rank"] in (0, None):
        mine["node_gpus"] = _safe(facts.gpus)
        mine["kernel_xids"] = _safe(kernel_xids.read)
    use_cuda = torch.cuda.is_available() and mine["device"].get("exists")
    if use_cuda:
        torch.cuda.set_device(mine["device"]["ordinal"])
    device = torch.device("cuda" if use_cuda else "cpu")
    t0 = time.monotonic()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    mine["init_s"] = time.monotonic() - t0
    rank = dist.get_rank()
    from distdoctor.nccltest import comm

    everyone = comm.gather_json(mine, device)
    job = {"format": "distdoctor-check", "version": 1, "world_size": dist.get_world_size(),
           "backend": dist.get_backend(), "ranks": everyone}
    job["all_reduce"] = comm.gather_json(links.all_reduce_check(device), device)
    job["clock_offsets_s"] = links.clock_offsets(device)
    if os.environ.get(SWEEP_ENV) != "0" and dist.get_world_size() > 1:
        bw, lat = links.sweep(device)
        job["sweep"] = {"bytes": links.SWEEP_BYTES, "gbps": bw, "latency_us": lat}
    dist.barrier()
    dist.destroy_process_group()
    out = os.environ.get(OUT_ENV)
    if out and mine["local_rank"] in (0, None):
        tmp = f"{out}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(job, f)
        os.replace(tmp, out)
    elif not out and rank == 0:
        json.dump(job, sys.stdout)
    return 0


def _safe(fn):
    try:
        return fn()
    except Exception as exc:  # the check reports what it could not read
        return {"error": repr(exc)[:300]}


if __name__ == "__main__":
    sys.exit(main())
