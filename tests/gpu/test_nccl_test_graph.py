"""`distdoctor nccl-test -G` on one GPU against a bare loop of the same ops (CUDA-graph
replay, written directly against torch.distributed): the harness must report the time
the bare loop measures (ratio within 0.8-1.25 where an op takes >= 10 us), with no wrong
result. The ratios go to the GPU suite's summary either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from distdoctor.launch.env import free_port, rank_env
from gpu.gpu_support import JOBS, note_measurement, printed_json

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

SIZES = [4 << 20, 16 << 20, 64 << 20, 256 << 20]
ITERS, GRAPHS, WARMUP = 20, 10, 5
PLACE = {"all_reduce": "in_place", "all_gather": "out_of_place"}


def _run(argv: list[str], env: dict) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{argv}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc.stdout


def test_nccl_test_graph_mode_reports_what_a_bare_loop_measures(tmp_path):
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    out = tmp_path / "nccl.json"
    _run([sys.executable, "-m", "distdoctor", "nccl-test", "all_reduce", "all_gather",
          "--nproc", "1", "-b", "4M", "-e", "256M", "-f", "4", "-n", str(ITERS),
          "-w", str(WARMUP), "-G", str(GRAPHS), "-c", "1", "--json", str(out)], base)
    harness = json.loads(out.read_text())
    assert harness["backend"] == "nccl" and harness["ok"], harness
    bare_out = _run([sys.executable, str(JOBS / "bare_graph_loop.py"),
                     ",".join(map(str, SIZES)), str(ITERS), str(GRAPHS), str(WARMUP)],
                    rank_env(base, 0, 1, free_port()))
    bare = printed_json(bare_out, "BARE")[0]

    compared, off = 0, []
    for test in harness["tests"]:
        op = test["op"]
        for row in test["results"]:
            place = row[PLACE[op]]
            assert place is not None and place["wrong"] == 0, (op, row)
            bare_us = bare[op][str(row["size"])]
            ratio = place["time_us"] / bare_us
            note_measurement("nccl_test_graph_vs_bare", op=op, size=row["size"],
                             harness_us=round(place["time_us"], 2), bare_us=round(bare_us, 2),
                             ratio=round(ratio, 3))
            if bare_us >= 10:
                compared += 1
                if not 0.8 <= ratio <= 1.25:
                    off.append(f"{op} {row['size']} B: harness {place['time_us']:.1f} us, "
                               f"bare {bare_us:.1f} us (ratio {ratio:.2f})")
    assert compared, f"no size took >= 10 us on the bare loop: {bare}"
    assert not off, "\n".join(off)
