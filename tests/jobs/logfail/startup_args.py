"""A training script whose required argument the launch command forgot: every rank exits
with argparse's usage error (exit code 2) before init_process_group."""

import argparse

import torch.distributed as dist

parser = argparse.ArgumentParser(description="train a small model")
parser.add_argument("--data-dir", required=True)
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()
dist.init_process_group("gloo")
