"""Every failure family read through every shape logs come in: launcher, srun, mpirun and Ray
prefixes, glog and time stamps, ANSI colour, `\\r` progress glued on, CRLF, hard wraps at 80
and 120 columns, ranks interleaved mid-line, invalid UTF-8, one file per rank, .gz. The
diagnosis must not change with the shape (a log cut in half may lose what was in its end)."""

from __future__ import annotations

import gzip

import pytest

from distdoctor.logs import scan_logs
from tests import logshapes
from tests.logcorpus import LOGS, cases, judge

# one recorded or source-grounded log per family, with what is right for it
FAMILIES = ["real/sigkill_rank2.log", "real/ddp_valueerror_rank1.log",
            "real/detail_mismatch_op.log", "real/gloo_timeout_rank3.log",
            "real/monitored_barrier_rank2.log", "real/ddp_unused.log",
            "source/cuda_oom_rank3.log", "source/nccl_shm_too_small.log",
            "source/watchdog_rank_behind_fr.log", "source/nccl_cuda217_p2p.log",
            "source/cuda_device_assert_rank2.log", "source/watchdog_pg_status_behind.log",
            "source/nccl_topo_sysfs_container.log", "source/torchrun_table_cut_before_root.log"]
EXPECTED = {f"{name}/{e['log']}": e for name, e in cases() if isinstance(e["log"], str)}
SHAPES = {k: v for k, v in logshapes.ALL_TEXT_SHAPES.items() if k != "cut_end"}


def _diagnose(path):
    return scan_logs([str(path)])[0]


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("fixture", FAMILIES)
def test_every_family_in_every_shape(tmp_path, fixture, shape):
    text = (LOGS / fixture).read_text(encoding="utf-8", errors="replace")
    path = tmp_path / "job.log"
    path.write_text(SHAPES[shape](text), encoding="utf-8", newline="")
    assert judge(EXPECTED[fixture], _diagnose(path)) == []


@pytest.mark.parametrize("fixture", FAMILIES)
def test_every_family_with_invalid_utf8_gzipped_and_per_rank(tmp_path, fixture):
    text = (LOGS / fixture).read_text(encoding="utf-8", errors="replace")
    bad = tmp_path / "bad.log"
    bad.write_bytes(logshapes.invalid_utf8(text))
    assert judge(EXPECTED[fixture], _diagnose(bad)) == []
    packed = tmp_path / "job.log.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    assert judge(EXPECTED[fixture], _diagnose(packed)) == []


@pytest.mark.parametrize("fixture", ["real/gloo_timeout_rank3.log",
                                     "source/watchdog_rank_behind_fr.log",
                                     "real/ddp_valueerror_rank1.log"])
def test_one_file_per_rank(tmp_path, fixture):
    text = (LOGS / fixture).read_text(encoding="utf-8", errors="replace")
    logshapes.split_per_rank(text, tmp_path / "per-rank")
    found = scan_logs([str(tmp_path / "per-rank" / "*")])[0]
    assert judge(EXPECTED[fixture], found) == []


@pytest.mark.parametrize("fixture", FAMILIES)
def test_a_log_cut_short_still_reads(tmp_path, fixture):
    text = (LOGS / fixture).read_text(encoding="utf-8", errors="replace")
    path = tmp_path / "cut.log"
    path.write_text(logshapes.cut_end(text, 0.7), encoding="utf-8")
    found, read = scan_logs([str(path)])
    assert "cut off" in read or not text.strip()
