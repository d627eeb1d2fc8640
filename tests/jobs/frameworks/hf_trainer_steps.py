"""HF Trainer on 2 CPU ranks (gloo, under torchrun): at a step of the Trainer's own
count, a callback on rank 0 alone all-reduces a metric (a main-process-only hook). The
finding must give `global_step` as the Trainer counts it, which the job prints.

    distdoctor run -- torchrun --nproc-per-node 2 hf_trainer_steps.py [--healthy]
"""

import sys
import tempfile
import warnings

import torch
import torch.distributed as dist
from transformers import Trainer, TrainerCallback, TrainingArguments

warnings.filterwarnings("ignore")
BUG_AT = 5


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x, labels):
        return {"loss": torch.nn.functional.mse_loss(self.layer(x).squeeze(-1), labels)}


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(4, generator=g), "labels": torch.randn((), generator=g)}


class RankZeroMetric(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if "--healthy" not in sys.argv and dist.get_rank() == 0 and state.global_step == BUG_AT:
            print(f"bug at global_step {state.global_step}", flush=True)
            dist.all_reduce(torch.ones(3))  # expect: culprit


if __name__ == "__main__":
    torch.set_num_threads(1)
    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="hf-steps-"), max_steps=12,
                             per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             save_strategy="no", report_to=[], use_cpu=True,
                             ddp_backend="gloo", logging_steps=1000, disable_tqdm=True,
                             dataloader_num_workers=0)
    Trainer(model=Tiny(), args=args, train_dataset=Data(),
            callbacks=[RankZeroMetric()]).train()  # expect: fit
