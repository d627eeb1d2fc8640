"""A training script importing a module the environment lacks: every rank fails with
ModuleNotFoundError before init_process_group."""

import torch.distributed as dist
from distdoctor_logfail_missing_pkg.models import build_model  # not installed anywhere

dist.init_process_group("gloo")
build_model()
