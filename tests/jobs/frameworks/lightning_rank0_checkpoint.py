"""Lightning DDP on 2 CPU ranks where a callback saves a checkpoint on rank 0 only, the
pattern of ray-project/ray#56997: `trainer.save_checkpoint` ends in Lightning's
`DDPStrategy.barrier`, which rank 0 enters alone while rank 1 trains on. The finding must
name each side's line and the framework frame that issued its op: Lightning's barrier
from `trainer.save_checkpoint` on rank 0, Lightning's backward from `trainer.fit` on
rank 1. `--healthy` saves on every rank, as Lightning asks.

    distdoctor run -- torchrun --nproc-per-node 2 lightning_rank0_checkpoint.py [--healthy]
"""

import os
import sys
import tempfile
import warnings
from datetime import timedelta

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import DDPStrategy

warnings.filterwarnings("ignore")


class Tiny(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(32, 4))
        return torch.utils.data.DataLoader(data, batch_size=4)


class SaveEveryEpoch(Callback):
    def __init__(self, directory: str):
        self.directory = directory

    def on_train_epoch_end(self, trainer, pl_module):
        path = os.path.join(self.directory, f"epoch{trainer.current_epoch}.ckpt")
        if "--healthy" in sys.argv or trainer.is_global_zero:
            trainer.save_checkpoint(path)  # expect: culprit


if __name__ == "__main__":
    torch.set_num_threads(1)
    trainer = Trainer(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                      strategy=DDPStrategy(timeout=timedelta(seconds=120)), max_epochs=3,
                      limit_val_batches=0, enable_progress_bar=False, logger=False,
                      enable_checkpointing=False, enable_model_summary=False,
                      callbacks=[SaveEveryEpoch(tempfile.mkdtemp())])
    trainer.fit(Tiny())  # expect: fit
