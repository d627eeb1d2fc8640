"""NCCL under `distdoctor run`: every op family recorded at its line, and each op's
completion time as the CUDA events of the same op measure it.

The tracer learns that a CUDA op finished by looking (tracer/completion.py): when the next
op enters, or at its sweeper's next pass. The job gives it the best case the design
promises, a barrier right after the host saw the op's end event, so the recorded
enter-to-completion time must match the events' time within 5% or 20 us, whichever is
larger (the issue's bound), as the median over the repetitions of each op.
"""

from __future__ import annotations

import statistics

import pytest
from conftest import run_cli

from distdoctor.runlog.run import read_run
from gpu.gpu_support import JOBS, marker_lines, note_measurement, printed_json

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

JOB = "nccl_ops.py"
REPS = 7
TIMED = ["all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
         "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
         "gather", "scatter", "async_all_reduce", "subgroup_all_reduce"]
P2P = ["send", "recv", "send_odd", "recv_odd", "batch_isend_irecv"]
RECORDED_AS = {"async_all_reduce": "all_reduce", "subgroup_all_reduce": "all_reduce",
               "send_odd": "send", "recv_odd": "recv"}


@pytest.fixture(scope="module", params=[pytest.param(1, id="world1"),
                                        pytest.param(2, id="world2", marks=pytest.mark.gpu(2))])
def traced(request, tmp_path_factory):
    world = request.param
    run_dir = tmp_path_factory.mktemp(f"nccl_ops_{world}") / "run"
    proc = run_cli(["run", "--nproc", str(world), "--run-dir", str(run_dir), "--grace", "2",
                    "--", str(JOBS / JOB), str(REPS)], timeout=240, run_dir=run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cuda = {d["rank"]: d for d in printed_json(proc.stdout, "CUDA_MS")}
    assert sorted(cuda) == list(range(world)), proc.stdout[-2000:]
    return world, read_run(run_dir), cuda


def at_lines(events) -> dict[str, list]:
    """This job's events, by the marker of their line, in issue order."""
    by_line = {line: name for name, line in marker_lines(JOB).items()}
    out: dict[str, list] = {}
    for ev in events:
        cs = ev.callsite
        if cs and cs["file"].endswith(JOB) and cs["line"] in by_line:
            out.setdefault(by_line[cs["line"]], []).append(ev)
    return out


def test_every_op_family_on_nccl_is_recorded_at_its_line(traced):
    world, run, cuda = traced
    assert sorted(run.events) == list(range(world))
    for rank, events in run.events.items():
        assert not cuda[rank]["failed"], f"rank {rank}: NCCL refused {cuda[rank]['failed']}"
        seen = at_lines(events)
        names = TIMED + ["barrier"] + ([n for n in P2P if (rank % 2 == 1) == n.endswith("_odd")
                                        or n == "batch_isend_irecv"] if world > 1 else [])
        for name in names:
            assert name in seen, f"rank {rank}: no event at the {name} line"
            ev = seen[name][0]
            want = RECORDED_AS.get(name, name)
            if name == "batch_isend_irecv":
                assert {e.op for e in seen[name]} == {"send", "recv"}, seen[name]
            else:
                assert ev.op == want, (rank, name, ev.op)
            assert all(e.status == "ok" and e.t_end_ns for e in seen[name]), (rank, name)
            assert ev.device.startswith("cuda"), (rank, name, ev.device)
        assert seen["reduce"][0].reduce_op == "max" and seen["broadcast"][0].peer == 0
        assert len(seen["all_reduce"]) == REPS
        assert seen["subgroup_all_reduce"][0].group != seen["all_reduce"][0].group


def test_completion_times_match_cuda_events(traced):
    world, run, cuda = traced
    worst = []
    for rank, events in run.events.items():
        seen = at_lines(events)
        for name in TIMED:
            recorded = [e.duration_ms for e in seen.get(name, [])]
            by_events = cuda[rank]["ms"].get(name, [])
            assert len(recorded) == len(by_events) == REPS, (rank, name, recorded, by_events)
            diff_us = statistics.median((r - c) * 1000 for r, c in zip(recorded, by_events, strict=True))
            cuda_us = statistics.median(by_events) * 1000
            bound_us = max(0.05 * cuda_us, 20.0)
            note_measurement("completion_vs_cuda_events", world=world, rank=rank, op=name,
                             cuda_us=round(cuda_us, 1), recorded_minus_cuda_us=round(diff_us, 1),
                             bound_us=round(bound_us, 1))
            if abs(diff_us) > bound_us:
                worst.append(f"rank {rank} {name}: CUDA events {cuda_us:.1f} us, recorded "
                             f"{cuda_us + diff_us:.1f} us (off by {diff_us:+.1f}, bound "
                             f"{bound_us:.1f})")
    assert not worst, "\n".join(worst)
