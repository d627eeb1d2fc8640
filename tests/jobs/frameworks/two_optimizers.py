"""A GAN's loop in plain torch: two DDP models and two optimizers, the critic's and the
generator's, each stepping once per iteration. The user counts iterations (7 iterations
are 7 steps of each optimizer, not 14 steps). At iteration BUG_AT rank 1 alone saves
samples and waits in a barrier for the others: a mismatch at that step."""

import datetime

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

BUG_AT, ITERATIONS = 7, 10

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(rank)
gen, critic = DDP(torch.nn.Linear(4, 4)), DDP(torch.nn.Linear(4, 1))
opt_gen = torch.optim.Adam(gen.parameters(), 1e-3)
opt_critic = torch.optim.Adam(critic.parameters(), 1e-3)


def save_samples(iteration):
    if rank == 1 and iteration == BUG_AT:
        steps = int(next(iter(opt_critic.state.values()))["step"])
        print(f"bug at iteration {iteration} after {steps} critic steps", flush=True)
        dist.barrier()  # expect: culprit


for iteration in range(1, ITERATIONS + 1):
    noise, real = torch.randn(8, 4), torch.randn(8, 4)
    critic_loss = critic(gen(noise).detach()).mean() - critic(real).mean()
    opt_critic.zero_grad()
    critic_loss.backward()  # expect: other
    opt_critic.step()
    gen_loss = -critic(gen(noise)).mean()
    opt_gen.zero_grad()
    gen_loss.backward()
    opt_gen.step()
    save_samples(iteration)
dist.destroy_process_group()
