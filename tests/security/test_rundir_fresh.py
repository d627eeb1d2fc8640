"""Run dirs in states the earlier hostile-run-dir checks (test_hostile_rundirs.py) did not
make, produced by real jobs under `distdoctor run`: a second incarnation that appears
while the job still runs, a kept-sources manifest no parser takes, thousands of junk
files at log names, call sites naming files of the machine that reads the run. The live
engine still names the hang and `--on-hang kill` still stops the job; every reader after
the fact says what it can read, never a traceback, and packs nothing it should not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import JOBS, marker_lines, run_cli, run_job
from test_hostile_rundirs import _cli, _copy, _log_of_rank, _sane

from distdoctor.runlog.run import traced_summary

NESTED = "[" * 100_000 + "]" * 100_000


@pytest.mark.timeout(120)
def test_a_helper_group_started_by_a_rank_never_hides_the_jobs_hang(tmp_path):
    """Rank 1 runs a helper that makes a one-rank group of its own (traced: a newer
    incarnation, beside the job's), then never joins the next all_reduce. Only the
    newest incarnation's ranks had their progress read and only its findings could stop
    the job: rank 1's last reading (taken while the helper ran) stood for good, the wait
    stayed a long wait, and `--on-hang kill` never fired (the job ran until killed)."""
    run_dir = tmp_path / "run"
    job = "security/helper_group_then_hang.py"
    res = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--grace", "2",
                   "--on-hang", "kill", "--", str(Path(__file__).parent.parent / "jobs" / job)],
                  timeout=60, run_dir=run_dir)
    err = res.stderr
    assert "stopping the job (--on-hang kill)" in err and res.returncode != 0, err[-3000:]
    assert "Traceback" not in err and "pass of the live diagnosis failed" not in err, err
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    hangs = [f for f in findings if f["kind"] == "hang" and f["severity"] == "error"]
    assert len(hangs) == 1 and hangs[0]["ranks"] == [1], findings
    assert hangs[0]["details"].get("incarnation") == 0, hangs[0]  # the job's, not the helper's
    stuck = marker_lines(job)["stuck"]
    assert any(c["rank"] == 1 and c["line"] == stuck for c in hangs[0]["callsites"]), hangs[0]
    assert not [f for f in findings if f["kind"] in ("internal", "crash")], findings


@pytest.fixture(scope="module")
def nested_manifest_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A 2-rank run (5 all_reduces) into a dir whose sources/manifest.json is nested
    100,000 deep before it starts."""
    run_dir = tmp_path_factory.mktemp("fresh") / "run"
    (run_dir / "sources").mkdir(parents=True)
    (run_dir / "sources" / "manifest.json").write_text(NESTED)
    return run_dir, run_job("many_ops.py", 2, run_dir, "5", timeout=60)


@pytest.mark.timeout(120)
def test_a_kept_sources_manifest_nested_too_deep_is_no_manifest(nested_manifest_run, tmp_path):
    """sources/manifest.json nested 100,000 deep (json.loads raised RecursionError): `run`
    into a dir holding it said 'cannot start the live diagnosis' and ran nothing; diagnose
    said 'a bug in distdoctor'; show, watch --once, pack and export printed a traceback.
    Now it counts as no manifest: the run goes on (its ranks write a manifest of their
    own), and the readers read the run as one that kept nothing."""
    run_dir, res = nested_manifest_run
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "2 rank(s) traced" in res.stderr, res.stderr[-3000:]
    run_dir = _copy(run_dir, tmp_path / "run")
    (run_dir / "sources" / "manifest.json").write_text(NESTED)  # (the ranks wrote theirs)
    said = _sane(_cli(["diagnose", run_dir]), codes=(0,))
    assert "no findings" in said.lower(), said
    for args in (["show", run_dir], ["watch", "--once", run_dir],
                 ["export", run_dir, "--perfetto", tmp_path / "t.json"],
                 ["pack", run_dir, "-o", tmp_path / "run.ddpack"]):
        _sane(_cli(args))
    shown = _sane(_cli(["show", run_dir, "--rank", "1"]))
    assert "all_reduce" in shown, shown


# Polls a run dir with a follower for as long as a live pass would, counting the opens
# of junk logs (rank-1NNNN.ring) once they are past being made, then after one of them
# is replaced by a real log.
FOLLOW = """
import os, sys, time
from distdoctor.runlog.follow import RESCAN_S, RunFollower

opened = [0]
def count(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        if os.path.basename(os.fsdecode(args[0])).startswith("rank-1"):
            opened[0] += 1
sys.addaudithook(count)

def follow(f, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        f.poll()
        time.sleep(0.25)

f = RunFollower(sys.argv[1])
follow(f, RESCAN_S + 1)  # still maybe being made: tried on each poll
opened[0] = 0
follow(f, 2 * RESCAN_S + 0.5)  # two full listings at least
print(opened[0])
sys.stdout.flush()
os.rename(sys.argv[2], sys.argv[3])  # a real log at a junk name
follow(f, RESCAN_S + 1)
print(sorted(k for k in [*f.feeds, *f.retired] if k[0] >= 10000))  # (read: let go, closed)
"""


@pytest.mark.timeout(60)
def test_junk_at_log_names_is_not_opened_again_on_every_poll(nested_manifest_run, tmp_path):
    """2,000 four-byte files at log names in ranks/ (a job's stray output, a hostile
    rank): each was opened again on every poll of the live engine, as a log maybe still
    being made (10,000 of them: 0.25 s of CPU a poll, for the whole run). Unreadable
    past RESCAN_S, one is opened again only when what is at its name changes: a real log
    put there is still picked up."""
    run_dir = _copy(nested_manifest_run[0], tmp_path / "run")
    ranks = run_dir / "ranks"
    for rank in range(10_000, 12_000):
        (ranks / f"rank-{rank:05d}.ring").write_bytes(b"junk")
    real = _log_of_rank(run_dir, 10_005, tmp_path / "real.ring")
    done = subprocess.run([sys.executable, "-c", FOLLOW, str(run_dir), str(real),
                           str(ranks / "rank-10005.ring")],
                          capture_output=True, text=True, timeout=45)
    assert done.returncode == 0, done.stderr[-3000:]
    opened, picked = done.stdout.split("\n")[:2]
    assert opened == "0", done.stdout
    assert picked == "[(10005, 0)]", done.stdout


@pytest.mark.timeout(60)
def test_junk_at_log_names_costs_diagnose_a_few_notes_not_one_each(nested_manifest_run,
                                                                   tmp_path):
    """diagnose named each unreadable log in a note of its own: 10,000 junk files at log
    names were 20,037 lines under the diagnosis (5 s). The first few are named, the rest
    counted in one line; the job's own ranks are diagnosed as before."""
    run_dir = _copy(nested_manifest_run[0], tmp_path / "run")
    for rank in range(10_000, 12_000):
        (run_dir / "ranks" / f"rank-{rank:05d}.ring").write_bytes(b"junk")
    said = _sane(_cli(["diagnose", run_dir]), codes=(0,))
    assert said.count("note:") < 20, said[-3000:]
    assert "rank(s) 10008-11999: 1992 more event logs not read" in said, said[-3000:]
    report = json.loads(_cli(["diagnose", run_dir, "--json"]).stdout)
    assert report["findings"] == [] and len(report["notes"]) < 20, report["notes"]
    # run's summary line of such a dir: "2002 rank(s) traced (r0:... r11999:unreadable)"
    # before, every one listed (one line of 30 KB)
    line = traced_summary(run_dir)
    assert line.startswith("2 rank(s) traced") and len(line) < 500, line[:1000]
    assert line.endswith("; 2000 rank(s) with no readable log"), line[-300:]


def _name_in_call_sites(run_dir: Path, path: str) -> None:
    """The run's call sites name `path` instead of the job's file (a crafted log: the
    string table's bytes replaced in place, same length, slashes padding the path)."""
    old = str(JOBS / "many_ops.py").encode()
    new = path.encode()
    if len(new) > len(old):
        pytest.skip(f"{path} is longer than {old!r}")
    new = new.replace(b"/", b"/" * (1 + len(old) - len(new)), 1)
    for ring in (run_dir / "ranks").glob("rank-*.ring"):
        with open(ring, "r+b") as f:
            table = f.read(4096 + (4 << 20))
            assert old in table
            f.seek(0)
            f.write(table.replace(old, new))


def _packed_texts(run_dir: Path, out: Path) -> bytes:
    from distdoctor.runlog.unpack import unpacked

    _sane(_cli(["pack", run_dir, "-o", out]), codes=(0,))
    with unpacked(out) as back:
        return b"".join(p.read_bytes() for p in Path(back).rglob("*.src"))


@pytest.mark.timeout(60)
def test_a_crafted_call_site_never_packs_another_file_of_this_machine(
        nested_manifest_run, tmp_path):
    """`pack` takes from the disk a file the call sites name that the run kept no copy
    of (an older run dir): a crafted log naming any file put it into the pack, made to be
    shared (a secret of the packing user, a key, a token). Only a Python source of the
    run dir's owner is taken."""
    secret = Path(tempfile.mkdtemp(prefix="dd", dir="/tmp"))
    try:
        for name in ("s.py", "s.txt"):
            (secret / name).write_text(f"TOKEN = 'SECRET-{name}'\n")
        run = _copy(nested_manifest_run[0], tmp_path / "run")
        _name_in_call_sites(run, str(secret / "s.txt"))
        assert b"SECRET" not in _packed_texts(run, tmp_path / "txt.ddpack")  # not Python
        run = _copy(nested_manifest_run[0], tmp_path / "run_py")
        _name_in_call_sites(run, str(secret / "s.py"))
        # the older run dir's case still works: the job's own source, on this host
        assert b"SECRET-s.py" in _packed_texts(run, tmp_path / "py.ddpack")
        if os.geteuid() == 0:  # a run dir of another user: root's files stay out
            run = _copy(nested_manifest_run[0], tmp_path / "run_theirs")
            _name_in_call_sites(run, str(secret / "s.py"))
            os.chown(run, 65534, 65534)
            assert b"SECRET" not in _packed_texts(run, tmp_path / "theirs.ddpack")
    finally:
        shutil.rmtree(secret)
