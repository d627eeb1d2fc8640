"""Reference trainer: a small GPT trained with any mix of DDP, FSDP2/HSDP, TP+SP, PP and EP,
and faults injected on demand. Runs on CPU (gloo) or CUDA (NCCL), chosen automatically.

Runbook (CPU; use `distdoctor run --nproc N --` in place of `torchrun ...` to trace it):

  # one process, no process group: the reference losses
  python -m distdoctor.reference_trainer --steps 20

  # DDP, FSDP2, HSDP
  torchrun --nproc-per-node 2 -m distdoctor.reference_trainer --dp 2
  torchrun --nproc-per-node 2 -m distdoctor.reference_trainer --fsdp 2
  torchrun --nproc-per-node 4 -m distdoctor.reference_trainer --dp 2 --fsdp 2

  # tensor parallel + sequence parallel, with DDP-style replicas
  torchrun --nproc-per-node 4 -m distdoctor.reference_trainer --dp 2 --tp 2

  # pipeline: gpipe | 1f1b | interleaved1f1b (2 stages per rank)
  torchrun --nproc-per-node 2 -m distdoctor.reference_trainer --pp 2 --schedule interleaved1f1b

  # MoE with expert parallelism borrowed from the data-parallel ranks
  torchrun --nproc-per-node 2 -m distdoctor.reference_trainer --dp 2 --ep 2 --experts 4

  # everything at once on 8 ranks
  torchrun --nproc-per-node 8 -m distdoctor.reference_trainer \\
      --dp 2 --tp 2 --pp 2 --schedule 1f1b --experts 4 --ep 2 --steps 50

  # faults (repeatable; --timeout-s bounds how long a hung collective waits)
  torchrun --nproc-per-node 2 -m distdoctor.reference_trainer --dp 2 \\
      --inject straggler:rank=1,ms=200,every=2 --inject mismatch:rank=1,step=5
  torchrun --nproc-per-node 4 -m distdoctor.reference_trainer --pp 4 \\
      --inject slowlink:stage=1,ms=50 --inject throttle:rank=3,factor=3

Rank 0 prints one line per step: loss (the global mean, identical to a single-process run
of the same seed within float rounding), step time and tokens/s. The step's loss
all-reduce is the collective the mismatch/shape/skip faults tamper with.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial

import torch
from torch import nn

import distdoctor

from .config import UsageError, device_type, launch_env, parse_config
from .data import MarkovData
from .faults import SIMULATED, FaultInjector
from .model import build_model, cross_entropy
from .parallel import parallelize

PROG = "reference_trainer"
# One line per step from rank 0; parse_step_log() reads it back (tests, benchmarks, demo).
STEP_LINE = "step {step:4d}/{steps} | loss {loss:.6f} | {ms:8.1f} ms | {tps:9.0f} tok/s"
_STEP_RE = re.compile(r"step +(\d+)/(\d+) \| loss (\S+) \| +([\d.]+) ms \| +(\d+) tok/s")


def parse_step_log(text: str) -> list[dict]:
    """[{"step", "loss", "ms", "tokens_per_s"}, ...] from a rank's stdout."""
    return [{"step": int(m[1]), "loss": float(m[3]), "ms": float(m[4]),
             "tokens_per_s": float(m[5])} for m in _STEP_RE.finditer(text)]


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m distdoctor.reference_trainer ARGS`, or main(ARGS) -> exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    rank = 0
    try:
        env = launch_env()
        rank = env["rank"]
        cfg = parse_config(argv, env["world_size"], description=__doc__)
    except UsageError as exc:
        # Every rank reaches the same verdict; one line from rank 0 is enough.
        if rank == 0:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    train(cfg, env)
    return 0


def log(message: str) -> None:
    print(f"{PROG}: {message}", flush=True)


def _setup_distributed(cfg, env) -> tuple[torch.device, object]:
    """(device, group of the loss all-reduce or None). Gloo on CPU, NCCL on CUDA."""
    use_cuda = device_type(cfg.device) == "cuda"
    device = torch.device("cuda", env["local_rank"]) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not env["distributed"]:
        return device, None
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    timeout = timedelta(seconds=cfg.timeout_s)
    # DeviceMesh creates its sub-groups with c10d's module defaults (30 min gloo, 10 min
    # NCCL), not with the default group's timeout: set them so --timeout-s bounds every group.
    distributed_c10d.default_pg_timeout = timeout
    distributed_c10d.default_pg_nccl_timeout = timeout
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timeout)
    cfg.dims.build_mesh(device.type)
    # The loss all-reduce gets a group of its own, so it can never pair up with a training
    # collective: a rank that skips it leaves the others waiting there (a clean hang)
    # instead of desynchronising DDP's or FSDP's own sequence on a shared group.
    loss_group = dist.new_group(list(range(env["world_size"])), timeout=timeout,
                                group_desc="loss_reduce")
    return device, loss_group


def _describe(cfg, n_params: int, device) -> str:
    d = cfg.dims
    axes = [f"{n} {v}" for n, v in (("dp_replicate", d.dp_replicate), ("dp_shard", d.dp_shard),
                                    ("tp", d.tp), ("pp", d.pp), ("ep", d.ep)) if v > 1]
    m = cfg.model
    kind = f"MoE {m.n_experts} experts top-{m.top_k}" if m.n_experts else "dense"
    pp = f", schedule {cfg.schedule} x{cfg.microbatches} microbatches" if d.pp_enabled else ""
    return (f"world {d.world_size} ({' x '.join(axes) or 'no parallelism'}){pp}, "
            f"{device.type}; model {n_params / 1e6:.2f}M params ({kind}, {m.n_layers} layers, "
            f"dim {m.dim}), batch {cfg.batch_size} x {m.seq_len} tokens")


@dataclass
class Job:
    """What one rank trains: its model parts (one, or its pipeline stages) and their state."""

    parts: list[nn.Module]
    optimizer: torch.optim.Optimizer
    stage_ids: list[int] = field(default_factory=list)  # pipeline stages held (PP only)
    schedule: object = None  # pipeline schedule (PP only)
    expert_params: list[nn.Parameter] = field(default_factory=list)  # reduced by EP (EP only)


def build_job(cfg, rank: int, device: torch.device, faults: FaultInjector) -> Job:
    """Model -> pipeline split -> parallelize each part -> optimizer (-> schedule)."""
    dims = cfg.dims
    model = build_model(cfg.model, cfg.seed)
    faults.attach_throttle(model)
    if rank == 0:
        log(_describe(cfg, sum(p.numel() for p in model.parameters()), device))
        for f in cfg.faults:
            log(f"fault armed: {f}" + (f" ({SIMULATED})" if f.kind == "throttle" else ""))

    ids: list[int] = []
    if dims.pp_enabled:  # split first, on the full model; then each stage is parallelized
        from .parallel import pipeline_parallel as ppl

        ids = ppl.stage_ids(dims.coords(rank)["pp"], dims.pp, cfg.schedule)
        parts = ppl.split_model(model, ids, cfg.num_stages)
    else:
        parts = [model]
    parts = [parallelize(p.to(device), dims, cfg.activation_checkpointing) for p in parts]

    params = [p for part in parts for p in part.parameters()]
    # foreach=False: the per-tensor loop, identical math on plain tensors and DTensors, so
    # every mode updates weights with the same arithmetic as the single-process run.
    if cfg.optimizer == "sgd":
        optimizer = torch.optim.SGD(params, lr=cfg.lr, foreach=False)
    else:
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, foreach=False)
    job = Job(parts, optimizer, stage_ids=ids)
    if dims.ep_enabled:
        from .parallel.expert_parallel import expert_params

        job.expert_params = [p for part in parts for p in expert_params(part)]
    if dims.pp_enabled:
        job.schedule = ppl.build_schedule(parts, ids, cfg.num_stages, dims.mesh("pp"), device,
                                          cfg.schedule, cfg.microbatches, cross_entropy,
                                          faults.link_delay,
                                          partial(stage_example_args, cfg, device))
    return job


def stage_example_args(cfg, device, stage_id: int) -> dict:
    """One microbatch's input and output of pipeline stage `stage_id`, which only torch
    2.4's PipelineStage asks for (its buffers for p2p are shaped by them): token ids into the
    first stage, hidden states between stages, logits out of the last."""
    m = cfg.model
    rows = cfg.batch_size // cfg.dims.dp // cfg.microbatches
    hidden = torch.zeros(rows, m.seq_len, m.dim, device=device)
    tokens = torch.zeros(rows, m.seq_len, dtype=torch.long, device=device)
    last = stage_id == cfg.num_stages - 1
    return {"input_args": (tokens if stage_id == 0 else hidden,),
            "output_args": (torch.zeros(rows, m.seq_len, m.vocab_size, device=device)
                            if last else hidden,)}


def forward_backward(job: Job, cfg, inputs, targets):
    """Loss of this rank's batch (None on pipeline ranks without the last stage); leaves
    synchronised gradients behind."""
    if job.schedule is not None:
        from .parallel.pipeline_parallel import pipeline_step

        loss = pipeline_step(job.schedule, job.stage_ids, cfg.num_stages, inputs, targets)
    else:
        loss = cross_entropy(job.parts[0](inputs), targets)
        loss.backward()  # DDP / FSDP reduce gradients during this call
        loss = loss.detach()
    if job.expert_params:
        from .parallel.expert_parallel import reduce_expert_grads

        reduce_expert_grads(job.expert_params, cfg.dims)
    return loss


def train(cfg, env) -> list[float]:
    """Run the job; returns the per-step global losses (rank 0 logs them)."""
    torch.set_num_threads(1)  # ranks share the cores; more threads per rank only thrash
    rank, dims = env["rank"], cfg.dims
    device, loss_group = _setup_distributed(cfg, env)
    faults = FaultInjector(cfg.faults, rank)
    job = build_job(cfg, rank, device, faults)
    data = MarkovData(cfg.model.vocab_size, cfg.model.seq_len, cfg.seed)
    dp_rank = dims.coords(rank)["dp"]
    tokens_per_step = cfg.batch_size * cfg.model.seq_len
    losses: list[float] = []
    step = 0
    try:
        for step in range(1, cfg.steps + 1):
            # a named span per step: distdoctor's findings say in which step (no-op untraced)
            with distdoctor.trace(f"step {step}"):
                faults.before_step(step)  # straggler / crash / hang, before any collective
                start = time.perf_counter()
                inputs, targets = data.local_batch(step, cfg.batch_size, dp_rank, dims.dp)
                job.optimizer.zero_grad(set_to_none=True)
                loss = forward_backward(job, cfg, inputs.to(device), targets.to(device))
                job.optimizer.step()
                global_loss = reduce_loss_for_logging(loss, device, loss_group, faults, step)
                elapsed = time.perf_counter() - start
                losses.append(global_loss)
                if rank == 0 and (step % cfg.log_every == 0 or step == cfg.steps):
                    log(STEP_LINE.format(step=step, steps=cfg.steps, loss=global_loss,
                                         ms=elapsed * 1000, tps=tokens_per_step / elapsed))
    except Exception as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        print(f"[rank {rank}] {PROG}: step {step} failed: {type(exc).__name__}: {first_line}",
              file=sys.stderr, flush=True)
        raise
    _teardown()
    return losses


def reduce_loss_for_logging(loss, device, group, faults: FaultInjector, step: int) -> float:
    """The global mean loss, from the ranks that computed one (last pipeline stage).

    One all-reduce of [loss, 1] (or [0, 0] on ranks without a loss) over all ranks, every
    step: a sync point (on GPU, a CPU-GPU sync too), the price of an exact log line.
    TP ranks of a stage contribute identical losses, which leaves the mean unchanged.
    """
    import torch.distributed as dist

    has_loss = loss is not None
    buf = torch.tensor([loss.item() if has_loss else 0.0, float(has_loss)],
                       dtype=torch.float64, device=device)
    if group is not None:
        if faults.replaces_collective(step):
            faults.faulty_collective(buf, group, step)  # mismatch / shape / skip (faults.py)
        else:
            dist.all_reduce(buf, group=group)  # the step's loss all-reduce, on every healthy rank
    return (buf[0] / buf[1]).item() if buf[1] > 0 else float("nan")


def _teardown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # drains gloo's workers before exit: one that frees a finished op's tensor while
        # the interpreter is finalizing aborts the process (a torch race, untraced too)
        dist.barrier()
        dist.destroy_process_group()
