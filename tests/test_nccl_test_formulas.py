"""`distdoctor nccl-test` arithmetic that needs no second process: sizes, counts and
bandwidth formulas as nccl-tests has them, and the correctness check's expected values."""

from __future__ import annotations

import pytest
import torch

from distdoctor.errors import UserError
from distdoctor.nccltest.ops import OPS, bandwidths, layout
from distdoctor.nccltest.options import DTYPES, parse_size, size_sequence
from distdoctor.nccltest.results import combine
from distdoctor.nccltest.verify import count_wrong, fill, fill_reduced, tolerance, torch_dtype

# --- sizes ------------------------------------------------------------------------------


@pytest.mark.parametrize("text,expected", [
    ("8", 8), ("1K", 1024), ("64k", 65536), ("32M", 33554432), ("1G", 1 << 30),
    ("1.5K", 1536), ("4MB", 4 << 20), ("2GiB", 2 << 30),
])
def test_parse_size_takes_powers_of_two_suffixes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "12Q", "M", "-4", "1 K B"])
def test_parse_size_rejects_garbage_with_one_line(text):
    with pytest.raises(UserError) as err:
        parse_size(text, "-b/--minbytes")
    assert "\n" not in str(err.value) and "-b/--minbytes" in str(err.value)


def test_size_sequence_steps_like_nccl_tests():
    assert size_sequence(8, 128, 2, 0) == [8, 16, 32, 64, 128]
    assert size_sequence(8, 100, 2, 0) == [8, 16, 32, 64]  # never past -e
    assert size_sequence(1 << 20, 3 << 20, 1, 1 << 20) == [1 << 20, 2 << 20, 3 << 20]
    assert size_sequence(32 << 20, 32 << 20, 1, 1 << 20) == [32 << 20]  # the defaults


def test_runaway_size_list_is_refused():
    with pytest.raises(UserError, match="more than"):
        size_sequence(1, 1 << 30, 1, 1)


# --- counts and bandwidth ---------------------------------------------------------------

@pytest.mark.parametrize("op,size,elsize,n,count,size_col", [
    ("all_reduce", 1000, 4, 3, 250, 1000),
    ("broadcast", 1002, 4, 3, 250, 1000),  # rounds down to whole elements
    ("all_gather", 100, 4, 3, 8, 96),  # 25 elements: 8 per rank (16-byte chunks), 24 moved
    ("reduce_scatter", 100, 1, 3, 32, 96),  # 33 per rank -> 32 (16-byte aligned)
    ("all_to_all", 4096, 8, 4, 128, 4096),
    ("gather", 64, 8, 2, 4, 64),
    ("scatter", 8, 4, 2, 0, 0),  # too small to give any rank 16 bytes
    ("sendrecv", 64, 2, 5, 32, 64),
])
def test_layout_counts_as_nccl_tests(op, size, elsize, n, count, size_col):
    lay = layout(OPS[op], size, elsize, n)
    assert (lay.count, lay.size) == (count, size_col)


@pytest.mark.parametrize("op,algbw,busbw", [
    # 4,000,000 B of float on 4 ranks in 1 ms; busbw factors from nccl-tests' PERFORMANCE.md
    ("all_reduce", 4.0, 6.0),  # 2(n-1)/n = 1.5
    ("all_gather", 4.0, 3.0),  # (n-1)/n = 0.75
    ("reduce_scatter", 4.0, 3.0),
    ("all_to_all", 4.0, 3.0),
    ("gather", 4.0, 3.0),
    ("scatter", 4.0, 3.0),
    ("broadcast", 4.0, 4.0),  # 1
    ("reduce", 4.0, 4.0),
    ("sendrecv", 4.0, 4.0),
])
def test_busbw_factors_against_hand_computed_values(op, algbw, busbw):
    lay = layout(OPS[op], 4_000_000, 4, 4)
    got_alg, got_bus = bandwidths(OPS[op], lay, 1e-3)
    assert got_alg == pytest.approx(algbw) and got_bus == pytest.approx(busbw)


def test_busbw_factor_at_eight_ranks_and_gb_is_1e9():
    lay = layout(OPS["all_reduce"], 1 << 30, 4, 8)
    alg, bus = bandwidths(OPS["all_reduce"], lay, 0.01)
    assert alg == pytest.approx((1 << 30) / 1e9 / 0.01)
    assert bus == pytest.approx(alg * 14 / 8)


@pytest.mark.parametrize("average,expected", [(0, 3.0), (1, 5.0), (2, 3.0), (3, 7.0)])
def test_average_combines_ranks_like_dash_a(average, expected):
    assert combine([3.0, 5.0, 7.0], average) == expected


# --- correctness check ------------------------------------------------------------------

def _local_reduce(redop, tensors):
    acc = tensors[0].clone()
    for t in tensors[1:]:
        if redop == "sum":
            acc += t
        elif redop == "prod":
            acc *= t
        elif redop == "max":
            acc = torch.maximum(acc, t)
        else:
            acc = torch.minimum(acc, t)
    return acc


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d not in ("uint32", "uint64")])
@pytest.mark.parametrize("redop", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("nranks", [2, 7])
def test_expected_results_equal_a_reduction_done_in_the_dtype(dtype, redop, nranks):
    count = 1000
    inputs = []
    for r in range(nranks):
        t = torch.empty(count, dtype=torch_dtype(dtype))
        fill(t, redop, r, 0, nranks, dtype, seed=5)
        inputs.append(t)
    expected = torch.empty(count, dtype=torch_dtype(dtype))
    fill_reduced(expected, redop, nranks, 0, dtype, seed=5)
    assert count_wrong(_local_reduce(redop, inputs), expected,
                       *tolerance(redop, dtype, nranks)) == 0


def test_inputs_differ_by_rank_seed_and_offset():
    a, b, c, d = (torch.empty(64) for _ in range(4))
    fill(a, "data", 0, 0, 2, "float", 1)
    fill(b, "data", 1, 0, 2, "float", 1)
    fill(c, "data", 0, 0, 2, "float", 2)
    fill(d, "data", 0, 32, 2, "float", 1)
    assert not torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(a[32:], d[:32])  # absolute element index: chunks are slices


def test_check_counts_each_corrupted_element():
    expected = torch.empty(4096)
    fill_reduced(expected, "sum", 4, 0, "float", 9)
    result = expected.clone()
    assert count_wrong(result, expected) == 0
    result[[3, 700, 4095]] += 1.0
    assert count_wrong(result, expected) == 3
    result[10] = float("nan")
    assert count_wrong(result, expected) == 4


def test_avg_check_tolerates_rounding_but_not_errors():
    expected = torch.tensor([1.0 / 3.0, 2.0], dtype=torch.float16)
    close = expected.float().add(1e-4).half()
    rtol, atol = tolerance("avg", "half", 3)
    assert count_wrong(close, expected, rtol, atol) == 0
    assert count_wrong(expected + 0.5, expected, rtol, atol) == 2
