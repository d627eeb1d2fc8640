"""Every rank reports its steps, then raises the same KeyError in step 30: a failure
mid-run, after collectives and steps, never a start-up failure (issue 41). Its output
under torchrun is tests/fixtures/logs/round4/every_rank_raises_mid_run.log. 2 ranks."""
import datetime

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
metrics = {"loss": 0.0}
for step in range(1, 40):
    g = torch.ones(8) * step
    dist.all_reduce(g)
    metrics["loss"] = float(g[0])
    if step % 10 == 0:
        print(f"[rank{rank}] step {step} | loss {metrics['loss']:.3f} | lr 3e-4", flush=True)
    if step == 30:
        print(metrics["accuracy"])
