"""What the installed torch offers the trainer, looked up once, never assumed.

The trainer runs from torch 2.4 (FSDP2 and DTensor in their early, private homes) to the
newest release. Every API that moved or appeared in that range is found here by name, and
a parallel mode whose API this torch lacks is refused in one line naming the mode and the
missing piece (`missing_for`), never with a traceback from deep inside torch.
"""

from __future__ import annotations

import importlib
import inspect

import torch


def _first(*candidates: tuple[str, str]):
    """The first `module:attr` of `candidates` that imports, else None."""
    for module, attr in candidates:
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
    return None


# FSDP2 is public in torch.distributed.fsdp from torch 2.6; before, under _composable.
fully_shard = _first(("torch.distributed.fsdp", "fully_shard"),
                     ("torch.distributed._composable.fsdp", "fully_shard"))
# DTensor is public in torch.distributed.tensor from torch 2.5; before, under _tensor.
Replicate = _first(("torch.distributed.tensor", "Replicate"),
                   ("torch.distributed._tensor", "Replicate"))
Shard = _first(("torch.distributed.tensor", "Shard"), ("torch.distributed._tensor", "Shard"))
# DDP on FSDP2's machinery, for DTensor weights (DP x TP): recent torch only. torch 2.9's
# early replicate is another API (a 2-D mesh passed as device_mesh=) and is not used.
replicate = _first(("torch.distributed._composable.replicate_with_fsdp", "replicate"))
try:
    if replicate is not None and "mesh" not in inspect.signature(replicate).parameters:
        replicate = None
except (TypeError, ValueError):
    replicate = None


def parallelize_kwargs() -> dict:
    """src_data_rank=None where parallelize_module takes it (each rank keeps its own shard)."""
    from torch.distributed.tensor.parallel import parallelize_module

    if "src_data_rank" in inspect.signature(parallelize_module).parameters:
        return {"src_data_rank": None}
    return {}


def _input_output_style():
    """PrepareModuleInputOutput, or on torch 2.6 and older the same two hooks composed
    from PrepareModuleInput and PrepareModuleOutput (public since torch 2.2)."""
    from torch.distributed.tensor import parallel as tp

    if hasattr(tp, "PrepareModuleInputOutput"):
        return tp.PrepareModuleInputOutput

    class InputOutput(tp.ParallelStyle):
        def __init__(self, *, input_layouts, desired_input_layouts, use_local_input,
                     output_layouts, desired_output_layouts, use_local_output):
            super().__init__()
            self.prepare_input = tp.PrepareModuleInput(
                input_layouts=input_layouts, desired_input_layouts=desired_input_layouts,
                use_local_output=use_local_input)
            self.prepare_output = tp.PrepareModuleOutput(
                output_layouts=output_layouts, desired_output_layouts=desired_output_layouts,
                use_local_output=use_local_output)

        def _apply(self, module, device_mesh):
            self.prepare_input._apply(module, device_mesh)
            return self.prepare_output._apply(module, device_mesh)

    return InputOutput


PrepareModuleInputOutput = _input_output_style()


def no_forward_buffer_sync() -> dict:
    """DDP's switch for the per-forward buffer broadcast: `forward_sync_buffers` in recent
    torch, `broadcast_buffers` before it."""
    from torch.nn.parallel import DistributedDataParallel

    params = inspect.signature(DistributedDataParallel.__init__).parameters
    if "forward_sync_buffers" in params:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def stage_needs_example_inputs() -> bool:
    """torch 2.4's PipelineStage requires `input_args` (later ones infer shapes at run time)."""
    from torch.distributed.pipelining import PipelineStage

    param = inspect.signature(PipelineStage.__init__).parameters.get("input_args")
    return param is not None and param.default is inspect.Parameter.empty


def _fully_shard_can_ignore() -> bool:
    try:
        return "ignored_params" in inspect.signature(fully_shard).parameters
    except (TypeError, ValueError):
        return False


def fsdp_runs_on(device_type: str) -> bool:
    """FSDP2 on CPU drives its copies through torch.cpu.Stream's events (torch 2.9 has
    them; 2.4 and 2.6 do not, and FSDP2 fails at its first step there)."""
    if fully_shard is None:
        return False
    return device_type != "cpu" or hasattr(torch.cpu.Stream, "record_event")


def pipelining_fails_on(device_type: str, schedule: str) -> str | None:
    """Why this torch's pipelining fails on gloo by itself, untraced, or None. These are bugs
    of releases, not missing features: nothing to look up but the version.
    - 2.9.x: every schedule, in the first step's shape exchange ("Received data size doesn't
      match expected size", seen on 2.9.1);
    - before 2.9: the 1F1B schedules stall in their first step until gloo's timeout (seen on
      2.4.1 and 2.6.0); GPipe runs."""
    if device_type != "cpu":
        return None
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if version == (2, 9):
        return "--pp on CPU: torch 2.9's pipelining fails on gloo"
    if version < (2, 9) and schedule != "gpipe":
        return f"--schedule {schedule} on CPU needs torch >= 2.9 (gpipe runs)"
    return None


def missing_for(dims, device_type: str, schedule: str = "gpipe") -> str | None:
    """One line naming what this torch lacks for the requested parallel layout, or None."""
    needs = []
    uses_fsdp = dims.fsdp_enabled or (dims.dp_replicate > 1 and replicate is not None
                                      and (dims.tp_enabled or dims.pp_enabled))
    if uses_fsdp and not fsdp_runs_on(device_type):
        needs.append(f"FSDP2 on {device_type} (--fsdp, or --dp beside --tp/--pp) needs "
                     "torch >= 2.9" if fully_shard is not None else "--fsdp needs FSDP2")
    if dims.pp_enabled and (why := pipelining_fails_on(device_type, schedule)):
        needs.append(why)
    if dims.fsdp_enabled and dims.ep_enabled and not _fully_shard_can_ignore():
        needs.append("--ep beside --fsdp needs fully_shard(ignored_params=...)")
    if dims.tp_enabled and (Replicate is None or Shard is None):
        needs.append("--tp needs DTensor")
    if (dims.dp_replicate > 1 and not dims.fsdp_enabled and (dims.tp_enabled or dims.pp_enabled)
            and replicate is None):
        needs.append("--dp beside --tp or --pp needs replicate(mesh=...) of "
                     "replicate_with_fsdp (2.12 and newer have it; 2.9 does not)")
    if not needs:
        return None
    return (f"torch {torch.__version__} cannot run this layout: " + "; ".join(needs)
            + "; use a newer torch or another layout")
