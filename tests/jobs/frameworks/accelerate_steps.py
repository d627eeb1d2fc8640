"""Accelerate on 2 CPU ranks (under torchrun), gradient accumulation: the user counts
optimizer steps as Accelerate's examples do (`completed_steps` when gradients sync); at
one of them the main process alone reduces a metric. The finding must give that count.

    distdoctor run -- torchrun --nproc-per-node 2 accelerate_steps.py [--healthy]
"""

import sys

import torch
from accelerate import Accelerator

BUG_AT = 5

accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(128, 4), torch.randn(128, 1))
loader = torch.utils.data.DataLoader(data, batch_size=4)
model, opt, loader = accelerator.prepare(model, opt, loader)
completed_steps = 0
for x, y in loader:
    with accelerator.accumulate(model):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
    if accelerator.sync_gradients:
        completed_steps += 1
        if "--healthy" not in sys.argv and accelerator.is_main_process and (
                completed_steps == BUG_AT):
            print(f"bug after {completed_steps} optimizer steps", flush=True)
            accelerator.reduce(torch.ones(3))  # expect: culprit
    if completed_steps >= 10:
        break
accelerator.end_training()
