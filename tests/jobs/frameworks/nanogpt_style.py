"""A nanoGPT-style trainer, read in one sitting: a tiny GPT, DDP on gloo, gradient
accumulation under no_sync, AdamW, a cosine learning rate, and rank 0 alone evaluating
and writing a checkpoint every EVAL_EVERY iterations (as nanoGPT's train.py does: the
other rank waits for it at the next all-reduce, by design). Data is made here.

    distdoctor run -- torchrun --nproc-per-node 2 nanogpt_style.py [--iters N] [--bug]

--bug: rank 0 alone all-reduces its eval loss (the others never join that collective).
"""

import argparse
import math
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser()
ap.add_argument("--iters", type=int, default=120)
ap.add_argument("--bug", action="store_true")
args = ap.parse_args()

BLOCK, VOCAB, EMBD, LAYERS, HEADS = 32, 64, 32, 2, 2
BATCH, ACCUM, EVAL_EVERY, EVAL_ITERS = 8, 2, 25, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(EMBD), nn.LayerNorm(EMBD)
        self.attn = nn.MultiheadAttention(EMBD, HEADS, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(EMBD, 4 * EMBD), nn.GELU(), nn.Linear(4 * EMBD, EMBD))

    def forward(self, x):
        h = self.ln1(x)
        mask = torch.triu(torch.ones(x.size(1), x.size(1), dtype=torch.bool), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, EMBD), nn.Embedding(BLOCK, EMBD)
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.head = nn.Linear(EMBD, VOCAB, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        logits = self.head(self.blocks(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1337 + rank)
data = torch.randint(0, VOCAB, (20_000,))


def get_batch():
    ix = torch.randint(len(data) - BLOCK - 1, (BATCH,))
    x = torch.stack([data[i:i + BLOCK] for i in ix])
    return x, torch.stack([data[i + 1:i + 1 + BLOCK] for i in ix])


@torch.no_grad()
def estimate_loss(model):
    model.eval()
    loss = sum(model(*get_batch()).item() for _ in range(EVAL_ITERS)) / EVAL_ITERS
    model.train()
    return loss


def lr_at(it):
    return 1e-3 * 0.5 * (1 + math.cos(math.pi * it / args.iters))


torch.manual_seed(1337)
raw = GPT()
model = DDP(raw)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ckpt_dir = tempfile.mkdtemp(prefix="nanogpt-style-")
for it in range(args.iters):
    if it % EVAL_EVERY == 0 and rank == 0:
        val = estimate_loss(raw)
        torch.save({"model": raw.state_dict(), "iter": it}, os.path.join(ckpt_dir, "ckpt.pt"))
        if args.bug and it > 0:
            print(f"bug after {it} optimizer steps", flush=True)
            dist.all_reduce(torch.tensor([val]))  # expect: culprit
    for g in opt.param_groups:
        g["lr"] = lr_at(it)
    for micro in range(ACCUM):
        model.require_backward_grad_sync = micro == ACCUM - 1
        loss = model(*get_batch()) / ACCUM
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
dist.destroy_process_group()
