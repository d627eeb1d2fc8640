"""A Lightning DDP job that hangs: rank 0 alone logs a metric with sync_dist=True, so it
issues an all_reduce the other rank never joins. Lightning installs a SIGTERM handler,
and the ranks wait in gloo (where no Python handler runs): they outlive a SIGTERM.

Run under torchrun (2 ranks, CPU). Quiet and short: a tiny model, no progress bar,
logger or checkpoints; the process-group timeout is above any hang timeout a test uses.
"""

import os
import warnings
from datetime import timedelta

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.strategies import DDPStrategy

warnings.filterwarnings("ignore")


class Tiny(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        if self.global_rank == 0 and batch_idx == 2:
            self.log("loss", loss, sync_dist=True)  # expect: mismatch
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(64, 4))
        return torch.utils.data.DataLoader(data, batch_size=4)


if __name__ == "__main__":
    torch.set_num_threads(1)
    trainer = Trainer(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                      strategy=DDPStrategy(timeout=timedelta(seconds=300)), max_epochs=1,
                      max_steps=8, enable_progress_bar=False, logger=False,
                      enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Tiny())
