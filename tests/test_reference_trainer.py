"""Reference trainer: building blocks, and loss-for-loss correctness of every parallel mode.

Correctness: each parallel run (real ranks, gloo on CPU) must log the same per-step losses
as a single-process run of the same model, seed and data, within LOSS_TOL. The runs use
plain SGD: Adam divides each gradient by its own magnitude, so it would hide a gradient
that is, say, twice too large; SGD turns that into a loss difference of ~1e-1 by step 2.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from distdoctor.reference_trainer.config import UsageError, demo_degrees, parse_config
from distdoctor.reference_trainer.data import MarkovData
from distdoctor.reference_trainer.launch import launch
from distdoctor.reference_trainer.model import ModelArgs, build_model
from distdoctor.reference_trainer.parallel.dims import ParallelDims, ParallelDimsError
from distdoctor.reference_trainer.parallel.pipeline_parallel import layer_ranges, stage_ids
from distdoctor.reference_trainer.train import train

# Rank 0 logs losses with 6 decimals. Observed differences are ~1e-6 (float summation order:
# sharded matmuls, reduce-scatter vs all-reduce); a wrong gradient is off by > 1e-2.
LOSS_TOL = 1e-4
STEPS = 4
BASE = ["--optimizer", "sgd", "--steps", str(STEPS), "--layers", "4", "--dim", "32",
        "--heads", "4", "--seq-len", "16", "--vocab", "64", "--batch-size", "8"]
MOE = ["--experts", "4", "--top-k", "2"]


@functools.cache
def single_process_losses(extra: tuple[str, ...]) -> list[float]:
    """The reference: the same trainer, one process, no process group."""
    cfg = parse_config([*BASE, *extra], world_size=1)
    return train(cfg, {"distributed": False, "rank": 0, "world_size": 1, "local_rank": 0})


def assert_matches_single_process(nproc: int, args: list[str], moe: bool = False) -> None:
    model_args = tuple(MOE) if moe else ()
    result = launch(nproc, [*BASE, *model_args, *args], timeout_s=150, start="forkserver")
    assert result.ok, result.tail()
    got = [s["loss"] for s in result.steps()]
    want = single_process_losses(model_args)
    assert len(got) == STEPS, result.tail()
    assert want[-1] < want[0]  # it learns: the comparison is not between two constants
    for step, (g, w) in enumerate(zip(got, want, strict=True), 1):
        assert abs(g - w) <= LOSS_TOL, f"step {step}: {args} logged {g}, single process {w}"


# --- building blocks (in-process) -----------------------------------------------------------


def test_dims_reject_degrees_that_do_not_match_the_world_size():
    with pytest.raises(ParallelDimsError, match=r"--dp 2 x --tp 2 = 4 rank.*WORLD_SIZE=8"):
        ParallelDims(dp_replicate=2, tp=2, world_size=8)
    with pytest.raises(ParallelDimsError, match="must divide --dp x --fsdp = 2"):
        ParallelDims(dp_replicate=2, ep=4, world_size=2)
    with pytest.raises(ParallelDimsError, match="context parallelism is not available"):
        ParallelDims(cp=2, dp_replicate=1, world_size=2)
    with pytest.raises(ParallelDimsError, match=">= 1"):
        ParallelDims(tp=0, world_size=1)


def test_dims_coords_follow_the_documented_layout():
    dims = ParallelDims(pp=2, dp_replicate=2, dp_shard=1, tp=2, ep=2, world_size=8)
    # pp x dp_replicate x dp_shard x tp, row-major: rank 5 = pp 1, dp 0, tp 1.
    assert dims.coords(5) == {"pp": 1, "dp_replicate": 0, "dp_shard": 0, "tp": 1, "dp": 0,
                              "ep": 0, "dp_mod_ep": 0}
    assert [dims.coords(r)["tp"] for r in range(4)] == [0, 1, 0, 1]
    assert [dims.coords(r)["ep"] for r in range(4)] == [0, 0, 1, 1]  # EP borrows "dp"


def test_pipeline_split_is_contiguous_and_looped_for_interleaved():
    assert layer_ranges(5, 2) == [range(0, 3), range(3, 5)]
    assert stage_ids(1, 2, "1f1b") == [1]
    assert stage_ids(1, 2, "interleaved1f1b") == [1, 3]


def test_data_is_deterministic_and_split_by_rows():
    data = MarkovData(vocab_size=64, seq_len=16, seed=3)
    inputs, targets = data.global_batch(step=2, batch_size=4)
    again, _ = MarkovData(64, 16, 3).global_batch(2, 4)
    assert torch.equal(inputs, again)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    halves = [data.local_batch(2, 4, r, 2)[0] for r in range(2)]
    assert torch.equal(torch.cat(halves), inputs)
    assert not torch.equal(data.global_batch(3, 4)[0], inputs)


def test_moe_matches_a_per_token_loop():
    args = ModelArgs(vocab_size=16, dim=8, n_layers=1, n_heads=2, seq_len=4, n_experts=4,
                     top_k=2)
    moe = build_model(args, seed=0).layers["0"].feed_forward
    x = torch.randn(2, 4, 8)
    got = moe(x)
    tokens = x.reshape(-1, 8)
    scores = moe.router(tokens).softmax(-1)
    want = torch.zeros_like(tokens)
    e = moe.experts
    for t in range(tokens.shape[0]):
        weights, chosen = scores[t].topk(2)
        for w, k in zip(weights, chosen, strict=True):
            h = torch.nn.functional.silu(tokens[t] @ e.w1[k]) * (tokens[t] @ e.w3[k])
            want[t] += w * (h @ e.w2[k])
    torch.testing.assert_close(got.reshape(-1, 8), want)


def test_parse_config_rejects_shapes_that_cannot_shard():
    with pytest.raises(UsageError, match="--heads 4 is not divisible by --tp 8"):
        parse_config(["--tp", "8"], world_size=8)
    with pytest.raises(UsageError, match="--ep needs an MoE model"):
        parse_config(["--dp", "2", "--ep", "2"], world_size=2)
    with pytest.raises(UsageError, match="needs --microbatches >= --pp"):
        parse_config(["--pp", "4", "--microbatches", "2"], world_size=4)


def test_single_process_run_learns():
    losses = single_process_losses(())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0] - 0.1


# --- every parallel mode, and combinations, against the single-process losses ---------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("args", [
    ["--dp", "2"],                                # DDP
    ["--fsdp", "2"],                              # FSDP2
    ["--tp", "2"],                                # TP + sequence parallel
    ["--pp", "2", "--schedule", "gpipe"],         # PP
    ["--pp", "2", "--schedule", "1f1b"],
    ["--pp", "2", "--schedule", "interleaved1f1b"],
], ids=lambda a: "_".join(x.lstrip("-") for x in a))
def test_two_rank_mode_matches_single_process(args):
    assert_matches_single_process(2, args)


@pytest.mark.timeout(180)
def test_expert_parallel_matches_single_process():
    assert_matches_single_process(2, ["--dp", "2", "--ep", "2"], moe=True)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("args,moe", [
    (["--dp", "2", "--fsdp", "2"], False),                           # HSDP
    (["--dp", "2", "--tp", "2"], False),                             # dp x tp
    (["--dp", "2", "--pp", "2", "--ep", "2"], True),                 # dp x pp x ep
    (["--fsdp", "2", "--tp", "2", "--ep", "2"], True),               # fsdp x tp x ep (MoE)
    (["--dp", "4", "--ep", "2"], True),                              # ep < dp: replicas of experts
], ids=["hsdp", "dp_tp", "dp_pp_ep", "fsdp_tp_ep", "dp4_ep2"])
def test_four_rank_combination_matches_single_process(args, moe):
    assert_matches_single_process(4, args, moe=moe)


@pytest.mark.timeout(300)
def test_eight_ranks_fsdp_tp_pp_with_activation_checkpointing():
    assert_matches_single_process(8, ["--fsdp", "2", "--tp", "2", "--pp", "2", "--ac"])


@pytest.mark.timeout(300)
def test_eight_rank_demo_layout_dp_tp_pp_ep():
    flags = demo_degrees(8)
    assert flags[:6] == ["--dp", "2", "--tp", "2", "--pp", "2"] and "--ep" in flags
    assert_matches_single_process(8, flags, moe=True)  # same --experts 4 as the reference


def test_demo_degrees_fit_any_world_size():
    for world in range(1, 17):
        cfg = parse_config(demo_degrees(world), world_size=world)
        assert cfg.dims.world_size == world


@pytest.mark.timeout(180)
def test_adamw_default_matches_too():
    extra = ["--optimizer", "adamw"]
    result = launch(2, [*BASE, *extra, "--dp", "2"], timeout_s=150, start="forkserver")
    assert result.ok, result.tail()
    want = single_process_losses(tuple(extra))
    got = [s["loss"] for s in result.steps()]
    assert got == pytest.approx(want, abs=LOSS_TOL)
