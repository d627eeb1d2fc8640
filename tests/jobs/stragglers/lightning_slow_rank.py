"""A Lightning DDP job (unmodified, no spans) whose rank 1 augments each batch slowly.

Run under torchrun (2 ranks, CPU). Lightning calls the optimizer with a closure that runs
training_step and backward inside optimizer.step(); the tracer's steps are still the
optimizer's. Quiet and short: a tiny model, no progress bar, logger or checkpoints.
"""

import os
import time
import warnings

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.strategies import DDPStrategy

warnings.filterwarnings("ignore")


def augment(batch, rank):
    if rank == 1:
        time.sleep(0.03)  # expect: slow_line
    return batch


class Tiny(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x = augment(batch[0], self.global_rank)
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(400, 8))
        return torch.utils.data.DataLoader(data, batch_size=4)


if __name__ == "__main__":
    torch.set_num_threads(1)
    trainer = Trainer(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                      strategy=DDPStrategy(), max_epochs=1, max_steps=60,
                      enable_progress_bar=False, logger=False, enable_checkpointing=False,
                      enable_model_summary=False)
    trainer.fit(Tiny())
