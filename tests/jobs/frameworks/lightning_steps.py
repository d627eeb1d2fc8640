"""Lightning DDP on 2 CPU ranks, with the sanity check's validation batches and a
prefetching loop: at a step of Lightning's count, rank 0 alone all-reduces a metric
(a main-process-only block). The finding must give Lightning's own `global_step`, which
the job prints at the bug. `--healthy` leaves the bug out.

    distdoctor run -- torchrun --nproc-per-node 2 lightning_steps.py [--healthy]
"""

import os
import sys
import warnings
from datetime import timedelta

import lightning
import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.strategies import DDPStrategy

warnings.filterwarnings("ignore")
BUG_AT = 5


class Tiny(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        if "--healthy" not in sys.argv and self.global_rank == 0 and (
                self.trainer.global_step == BUG_AT):
            print(f"bug at global_step {self.trainer.global_step}", flush=True)
            dist.all_reduce(torch.ones(3))  # expect: culprit
        return loss

    def validation_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def _loader(self):
        data = torch.utils.data.TensorDataset(torch.randn(64, 4))
        return torch.utils.data.DataLoader(data, batch_size=4)

    def train_dataloader(self):
        return self._loader()

    def val_dataloader(self):
        return self._loader()


if __name__ == "__main__":
    torch.set_num_threads(1)
    if os.environ.get("RANK") == "0":  # where this Lightning runs from, for the test
        print(f"lightning from {os.path.dirname(lightning.__file__)}", flush=True)
    trainer = Trainer(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                      strategy=DDPStrategy(timeout=timedelta(seconds=120)), max_steps=10,
                      limit_val_batches=2, enable_progress_bar=False, logger=False,
                      enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Tiny())  # expect: fit
