"""Healthy jobs in which ranks wait a long time for a busy rank, one way per KIND:

  python long_waits.py KIND [SECONDS]     (2 ranks, gloo; SECONDS of work, default 12)

  checkpoint  rank 0 writes a checkpoint (real torch.save to disk) while rank 1 waits
  evaluate    rank 0 alone evaluates the model on batches
  prepare     main process first: rank 0 prepares (tokenizes) the data, rank 1 waits
  warmup      rank 0's first step is long (a slow warm-up)
  dataloader  rank 0's DataLoader stalls once (its worker sleeps on a slow source)
  generate    rank 0 evaluates in one call on one line (a library's loop: `generate()`)
None of these is a hang: each is a long wait naming rank 0 and its line.
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bugs"))
from _common import grads, init  # noqa: E402

KIND = sys.argv[1]
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 12.0
rank, world = init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))


def save_checkpoint(path):
    state = {f"w{i}": torch.randn(512, 512) for i in range(8)}  # 8 MB
    end = time.monotonic() + SECONDS
    while time.monotonic() < end:
        torch.save(state, path)  # expect: checkpoint
        os.sync()


def evaluate():
    end = time.monotonic() + SECONDS
    total = 0.0
    with torch.no_grad():
        while time.monotonic() < end:
            x = torch.randn(64, 256)
            total += model(x).sum().item()  # expect: evaluate
    return total


def tokenize(texts):
    end = time.monotonic() + SECONDS
    vocab = {}
    while time.monotonic() < end:
        for text in texts:
            for word in text.split():  # expect: prepare
                vocab[word] = vocab.get(word, 0) + 1
    return vocab


def warm_up():
    end = time.monotonic() + SECONDS
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    while time.monotonic() < end:
        loss = model(torch.randn(64, 256)).square().mean()  # expect: warmup
        loss.backward()
        opt.step()
        opt.zero_grad()


def generate():
    end = time.monotonic() + SECONDS
    batches = iter(lambda: torch.randn(64, 256), None)
    # one user line, the work inside torch's modules: only the full stack moves
    return sum(model(x).sum().item() for x in batches if time.monotonic() < end or 1 / 0)  # expect: generate


class SlowSource(torch.utils.data.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 2 and dist.get_rank() == 0:
            time.sleep(SECONDS)  # expect: dataloader
        return torch.randn(8)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        if KIND == "dataloader":
            loader = torch.utils.data.DataLoader(SlowSource(), batch_size=1, num_workers=1)
            for batch in loader:  # expect: loader
                dist.all_reduce(batch)  # expect: others
            return
        for step in range(3):
            if step == 0 and rank == 0 and KIND == "warmup":
                warm_up()  # the first step is slow on rank 0 only
            dist.all_reduce(grads())  # expect: first
            if step == 1 and rank == 0:
                if KIND == "checkpoint":
                    save_checkpoint(os.path.join(tmp, "ckpt.pt"))
                elif KIND == "evaluate":
                    evaluate()
                elif KIND == "generate":
                    try:
                        generate()
                    except ZeroDivisionError:  # the end of its batches
                        pass
            if step == 1 and KIND == "prepare":
                if rank != 0:
                    dist.barrier()  # expect: others
                else:
                    tokenize(["the quick brown fox jumps over the lazy dog"] * 200)
                    dist.barrier()
            else:
                dist.barrier()  # expect: others


main()
print(f"rank {rank} done", flush=True)
