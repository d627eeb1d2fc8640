"""`distdoctor pack` (issue 52): a run dir in one file that diagnose, show and export read
as they read the run dir, on another path with the job's source gone, with the same
findings; a pack that is not whole, ours or of this version is one line and exit 2."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest
from conftest import run_cli

from distdoctor.runlog import format as F
from distdoctor.runlog import pack as P

# rank 0 alone enters the `if` (line 13) and its barrier: a mismatch at that branch
JOB = """\
import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    for step in range(6):
        dist.all_reduce(t)
        if step == 3 and rank == 0:
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""
BRANCH_LINE = 11
RUNDIRS = Path(__file__).parent / "fixtures" / "rundirs"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The job, run once under `distdoctor run` (2 gloo ranks), and its pack."""
    base = tmp_path_factory.mktemp("packjob")
    script = base / "src" / "job.py"
    script.parent.mkdir()
    script.write_text(JOB)
    run_dir = base / "run"
    proc = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--on-hang", "kill",
                    "--grace", "2", "--", str(script)], timeout=90, run_dir=run_dir)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"distdoctor pack {run_dir} -o run.ddpack" in proc.stderr.splitlines()[-1]
    return base, script, run_dir


def _diagnose(target, cwd=None, env=None) -> tuple[list[dict], list[str], str]:
    proc = run_cli(["diagnose", str(target), "--json"], timeout=60, cwd=cwd, env=env)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout)
    return out["findings"], out["notes"], proc.stderr


def _pack(run_dir: Path, out: Path, *extra: str) -> None:
    proc = run_cli(["pack", str(run_dir), "-o", str(out), *extra], timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert out.stat().st_mode & 0o077 == 0  # the pack may hold the job's source


@pytest.mark.timeout(150)
def test_a_pack_read_elsewhere_without_the_source_gives_the_run_dirs_findings(run, tmp_path):
    base, script, run_dir = run
    here, _, _ = _diagnose(run_dir)
    mismatch = [f for f in here if f["kind"] == "mismatch"]
    assert mismatch and mismatch[0]["ranks"] == [0], here
    assert f"job.py:{BRANCH_LINE + 1}" in mismatch[0]["summary"], mismatch[0]["summary"]
    pack = tmp_path / "elsewhere" / "evidence.ddpack"
    pack.parent.mkdir()
    _pack(run_dir, pack)
    # a pack holds the used part of the logs, not their 64 MiB each
    assert pack.stat().st_size < 200_000
    away = script.with_name("job.py.away")
    script.rename(away)
    temp = tmp_path / "tmp"
    temp.mkdir()
    try:
        there, notes, _ = _diagnose(pack.name, cwd=pack.parent, env={"TMPDIR": str(temp)})
        shown_here = run_cli(["show", str(run_dir), "--json"], timeout=60)
        shown_there = run_cli(["show", str(pack), "--json"], timeout=60,
                              env={"TMPDIR": str(temp)})
    finally:
        away.rename(script)
    assert there == here
    assert not any("changed" in n for n in notes), notes
    events_here = json.loads(shown_here.stdout)
    events_there = json.loads(shown_there.stdout)
    assert events_here.pop("run_dir") == str(run_dir)
    assert events_there.pop("run_dir") == str(pack)  # the pack, as given: not its temp dir
    assert events_there == events_here
    assert not list(temp.iterdir())  # the unpacked run dir is gone after


@pytest.mark.timeout(120)
def test_a_script_edited_after_the_run_gives_the_same_findings_and_says_so(run):
    base, script, run_dir = run
    before, notes, _ = _diagnose(run_dir)
    assert not any("changed" in n for n in notes), notes
    script.write_text("import os\nimport sys\n" + JOB)
    try:
        after, notes, _ = _diagnose(run_dir)
        text = run_cli(["diagnose", str(run_dir)], timeout=60)
    finally:
        script.write_text(JOB)
    assert after == before
    assert [n for n in notes if "changed" in n] == [
        f"{script} changed since the run: the diagnosis reads the copy the run kept"]
    said = [line for line in text.stdout.splitlines() if "changed since the run" in line]
    assert len(said) == 1, text.stdout


def _entry(kind: int, name: str, raw: bytes, stated: int | None = None) -> bytes:
    stored = zlib.compress(raw)
    encoded = name.encode()
    return (P.ENTRY.pack(kind, 0, len(encoded), zlib.crc32(raw),
                         len(raw) if stated is None else stated, len(stored))
            + encoded + stored)


def _sealed(body: bytes, count: int, version: int = P.VERSION) -> bytes:
    data = P.HEAD.pack(P.MAGIC, version, 0) + body
    return data + P.ENTRY.pack(P.KIND_END, 0, 0, 0, count, 32) + hashlib.sha256(data).digest()


def _huge_log() -> bytes:
    head = bytearray(F.HEADER_SIZE)
    F.HEADER_STATIC.pack_into(head, 0, F.MAGIC, F.VERSION, F.HEADER_SIZE, F.SLOT_SIZE,
                              1 << 40, F.HEADER_SIZE, 4096, F.HEADER_SIZE + 4096, 0, 1)
    return P.RING_META.pack(8192 + (1 << 47), 0, 0, 0) + bytes(head)


def _bad_packs(good: bytes) -> dict[str, tuple[bytes, str]]:
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0xFF
    trailer = bytearray(good)
    trailer[-3] ^= 0x01
    run_json = _entry(P.KIND_FILE, "run.json", b'{"format": "distdoctor-run", "version": 1}')
    return {
        "truncated": (good[:len(good) * 2 // 3], "truncated"),
        "header only": (good[:10], "truncated"),
        "empty": (b"", "empty"),
        "corrupt": (bytes(flipped), "damaged"),
        "checksum": (bytes(trailer), "damaged"),
        "foreign": (b"\x1f\x8b\x08\x00" + good[4:200],
                    "neither a run directory nor a distdoctor pack"),
        "newer": (good[:8] + P.HEAD.pack(P.MAGIC, P.VERSION + 1, 0)[8:12] + good[12:],
                  "format version 2; this distdoctor reads up to 1: upgrade"),
        "path out": (_sealed(run_json + _entry(P.KIND_FILE, "../escaped", b"x"), 2),
                     "refused"),
        "absolute path": (_sealed(_entry(P.KIND_FILE, "/etc/passwd", b"x"), 1), "refused"),
        "inflates past its size": (_sealed(run_json + _entry(
            P.KIND_FILE, "findings.json", b"{}" * 50_000, stated=10), 2), "damaged"),
        "twice": (_sealed(run_json + run_json, 2), "twice"),
        "not a log": (_sealed(run_json + _entry(P.KIND_RING, "ranks/rank-00000.ring",
                                                b"\0" * 5000), 2), "damaged"),
        "a 128 TiB log": (_sealed(run_json + _entry(P.KIND_RING, "ranks/rank-00000.ring",
                                                    _huge_log()), 2), "damaged"),
    }


@pytest.mark.timeout(120)
def test_a_damaged_foreign_or_newer_pack_is_one_line_and_exit_2(run, tmp_path, capsys,
                                                                monkeypatch):
    from distdoctor.cli import main

    _, _, run_dir = run
    good_pack = tmp_path / "good.ddpack"
    _pack(run_dir, good_pack)
    good = good_pack.read_bytes()
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    for what, (data, says) in _bad_packs(good).items():
        bad = tmp_path / f"{what.replace(' ', '_')}.ddpack"
        bad.write_bytes(data)
        for command in (["diagnose", str(bad), "--json"], ["show", str(bad)],
                        ["export", str(bad), "--perfetto", str(tmp_path / "t.json")]):
            code = main(command)
            out, err = capsys.readouterr()
            assert code == 2, (what, command, err)
            assert out == "" and "Traceback" not in err, (what, err)
            lines = err.strip().splitlines()
            assert len(lines) == 1 and says in lines[0], (what, err)
        assert not list(temp.iterdir()), what  # nothing left behind
    assert not (tmp_path / "escaped").exists() and not (temp.parent / "escaped").exists()
    # and as a user runs it: one line, no traceback, from the command itself
    for what in ("truncated", "newer"):
        proc = run_cli(["diagnose", str(tmp_path / f"{what}.ddpack")], timeout=60)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.timeout(120)
def test_the_hf_trainer_run_dir_packed_with_its_source_reads_the_same_without_it(tmp_path):
    """The corpus run dir whose findings changed with its job.py gone (an older run dir:
    it kept no copy; the pack takes the file from the disk)."""
    folder = RUNDIRS / "hf_predict_main_only"
    run_dir = tmp_path / "hf"
    run_dir.mkdir()
    subprocess.run(["tar", "--sparse", "-xzf", str(folder / "rundir.tar.gz"), "-C",
                    str(run_dir)], check=True)
    source = Path((folder / "source_path").read_text().strip())
    job = (folder / "job.py").read_bytes()
    if source.exists() and source.read_bytes() != job:
        pytest.skip(f"{source} exists with other contents")
    placed = not source.exists()
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_bytes(job)
    away = source.with_name("job.py.away")
    try:
        here, _, _ = _diagnose(run_dir)
        pack = tmp_path / "hf.ddpack"
        _pack(run_dir, pack)
        source.rename(away)
        there, _, _ = _diagnose(pack)
    finally:
        if away.exists():
            away.rename(source)
        if placed:
            source.unlink()
            with_dir = source.parent
            if not os.listdir(with_dir):
                shutil.rmtree(with_dir, ignore_errors=True)
    assert there == here
    mismatch = [f for f in there if f["kind"] == "mismatch"]
    assert mismatch and mismatch[0]["ranks"] == [0], there
    assert "is_world_process_zero" in mismatch[0]["summary"]


def test_a_wrapped_log_comes_back_as_its_reader_reads_it(tmp_path):
    """A ring that wrapped (its newest events at its start) and an event still in
    flight: the log read from the pack is the log read from the run dir."""
    from distdoctor.runlog import rundir
    from distdoctor.runlog.reader import RankLog
    from distdoctor.runlog.ring import RingWriter
    from distdoctor.runlog.unpack import unpacked

    run_dir = tmp_path / "run"
    rundir.write_run_meta(run_dir, launcher="test")
    w = RingWriter(str(rundir.ring_path(run_dir, 0)), 0, 16 * F.SLOT_SIZE, 4096)
    group = w.add_string({"name": "0", "desc": "default_pg", "ranks": [0, 1]})
    for i in range(41):
        e = w.append(F.KIND_COLLECTIVE, F.OP_CODE["all_reduce"], 0, 0, group, 0, i, -1, 0,
                     4, 4, 1000 * i, 0, 0)
        if i < 40:
            w.complete(e, F.STATUS_OK, 1000 * i + 500)
    w.close()
    pack = tmp_path / "p.ddpack"
    P.write_pack(run_dir, pack)
    with unpacked(pack) as back:
        mine, theirs = (RankLog(rundir.ring_path(d, 0)) for d in (run_dir, back))
        assert [e.seq for e in theirs.read()] == list(range(25, 41))
        assert theirs.read() == mine.read() and theirs.header() == mine.header()
        assert theirs.read()[-1].status == "in_flight"
        assert (rundir.ring_path(back, 0).stat().st_size
                == rundir.ring_path(run_dir, 0).stat().st_size)
        mine.close()
        theirs.close()


@pytest.mark.timeout(180)
def test_a_big_log_is_unpacked_as_it_inflates_never_held_whole(tmp_path):
    """A valid pack whose log entry is 100 MiB (a million events in a ring that wrapped):
    unpacked in a child process whose heap may grow by a quarter of that (it was held
    whole, then turned into rows: twice its size), the log comes back byte for byte."""
    import sys

    from distdoctor.runlog import rundir
    from distdoctor.runlog.ring import RingWriter

    run_dir = tmp_path / "run"
    rundir.write_run_meta(run_dir, launcher="test")
    w = RingWriter(str(rundir.ring_path(run_dir, 0)), 0, 100 << 20, 1 << 20)
    group = w.add_string({"name": "0", "desc": "default_pg", "ranks": [0, 1]})
    for i in range(1_000_000):
        if i % 4096 == 0:
            w.reserve_ahead()  # the recorder's thread does this beside a job
        e = w.append(F.KIND_COLLECTIVE, F.OP_CODE["all_reduce"], 0, 0, group, 0, i, -1, 0,
                     4, 4, 1000 * i, 0, 0)
        w.complete(e, F.STATUS_OK, 1000 * i + 500)
    assert e >= 0
    w.close()
    pack = tmp_path / "p.ddpack"
    P.write_pack(run_dir, pack)
    entry = w.capacity * F.SLOT_SIZE  # every slot: the ring wrapped
    # the child's data (heap and private memory; not the log's shared file map) may grow
    # by a quarter of the entry: the entry held whole needs four times that
    child = ("import re, resource, sys\n"
             "from distdoctor.runlog.unpack import unpack\n"
             "data = int(re.search(r'VmData:\\s+(\\d+)', open('/proc/self/status').read())[1])\n"
             "limit = data * 1024 + int(sys.argv[3])\n"
             "resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))\n"
             "unpack(sys.argv[1], sys.argv[2])\n")
    dest = tmp_path / "back"
    dest.mkdir(mode=0o700)
    done = subprocess.run([sys.executable, "-c", child, str(pack), str(dest), str(entry // 4)],
                          capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    digest = [hashlib.sha256(rundir.ring_path(d, 0).read_bytes()).hexdigest()
              for d in (run_dir, dest)]
    assert digest[0] == digest[1]


@pytest.mark.timeout(60)
def test_a_pack_is_named_as_itself_never_by_its_temp_dir(run, tmp_path, capsys, monkeypatch):
    """diagnose, show, export and watch on a pack name the pack where they name the run
    dir (text and JSON); a note on one of its files names it inside the pack."""
    from distdoctor.cli import main
    from distdoctor.runlog.unpack import unpack

    _, _, run_dir = run
    # the run dir, with an exits.json that is not whole: its note names the file
    again = tmp_path / "again"
    again.mkdir()
    first = tmp_path / "first.ddpack"
    P.write_pack(run_dir, first)
    unpack(first, again)
    (again / "exits.json").write_text("{")
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.chdir(tmp_path)
    for name in ("job.ddpack", 'a "quoted" pack'):
        P.write_pack(again, tmp_path / name)
        said = {}
        for command in (["diagnose", name], ["diagnose", name, "--json"],
                        ["show", name], ["show", name, "--json"],
                        ["export", name, "--perfetto", "t.json"],
                        ["export", name, "--perfetto", "-"], ["watch", name, "--once"]):
            code = main(command)
            out, err = capsys.readouterr()
            assert code in (0, 1), (command, err)
            text = out + err + (Path("t.json").read_text() if "t.json" in command else "")
            assert str(temp) not in text and "ddpack-" not in text, (command, text)
            said[" ".join(command[:1] + command[2:])] = out
        assert f"diagnosis of run {name}" in said["diagnose"]
        assert f"{name}/exits.json is unreadable" in said["diagnose"]
        diagnosed = json.loads(said["diagnose --json"])
        assert diagnosed["sources"] == [f"run {name}"]
        assert f"{name}/exits.json is unreadable: process exit codes unknown" in \
            diagnosed["notes"]
        assert json.loads(said["show --json"])["run_dir"] == name
        assert name in said["show"]
        for trace in (Path("t.json").read_text(), said["export --perfetto -"]):
            assert json.loads(trace)["otherData"]["run_dir"] == name
        assert name in said["watch --once"]
    assert not list(temp.iterdir())
