"""A Lightning run on CPU with 2 processes (strategy ddp, gloo) whose rank 1 raises in
training_step at batch 3 (with --healthy: it does not). Run with plain python: Lightning
starts rank 1 itself. With --rank0-busy, rank 0 is off in a 40 s wait at that batch (as it
would wait in an NCCL collective, which notices no dead peer): Lightning's process observer
then SIGKILLs it, and a shell running the job says "Killed".

    python tests/jobs/logfail/lightning_job.py [--healthy | --rank0-busy]
"""

import datetime
import os
import sys
import time

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy

HEALTHY = "--healthy" in sys.argv  # the same run without the failure
BUSY = "--rank0-busy" in sys.argv


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.global_rank == 1 and batch_idx == 3 and not HEALTHY:
            raise ValueError(f"batch {batch_idx}: label contains NaN (simulated bad sample)")
        if self.global_rank == 0 and batch_idx == 3 and BUSY:
            time.sleep(40)
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo",
                             timeout=datetime.timedelta(seconds=90 if BUSY else 3)),
        max_epochs=1,
        enable_checkpointing=False,
        logger=False,
        enable_model_summary=False,
        default_root_dir=os.environ.get("TMPDIR", "/tmp"),
    )
    trainer.fit(Model(), loader)


if __name__ == "__main__":
    main()
