"""The run keeps what it is judged by (issue 52): each rank notes the files its call sites
name; a thread of its own keeps their hashes and, within bounds, their copies, once per
run whatever the ranks of a node do at once; frameworks' files by version only.
`run --no-source` (DISTDOCTOR_SOURCES=0) keeps hashes only: a file edited after such a
run is not read, and said so."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest
from conftest import run_cli
from test_pack import JOB

from distdoctor.runlog import kept, sources


@pytest.mark.timeout(120)
def test_without_copies_an_edited_script_is_not_read_and_said_so(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    run_dir = tmp_path / "run"
    proc = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--on-hang", "kill",
                    "--grace", "2", "--no-source", "--", str(script)], timeout=90,
                   run_dir=run_dir)
    assert "Traceback" not in proc.stderr, proc.stderr
    manifest = json.loads((run_dir / "sources" / "manifest.json").read_text())
    entry = manifest["files"][str(script)]
    assert entry["sha256"] == hashlib.sha256(JOB.encode()).hexdigest()
    assert "copy" not in entry and "--no-source" in entry["why"]
    assert not list((run_dir / "sources").glob("*.src"))
    before = json.loads(run_cli(["diagnose", str(run_dir), "--json"]).stdout)
    assert not before["notes"] or not any("changed" in n for n in before["notes"])
    assert any(f["kind"] == "mismatch" and f["ranks"] == [0] for f in before["findings"])
    script.write_text("import os\nimport sys\n" + JOB)
    after = json.loads(run_cli(["diagnose", str(run_dir), "--json"]).stdout)
    said = [n for n in after["notes"] if "changed since the run" in n]
    assert said == [f"{script} changed since the run, which kept no copy of it (copies off "
                    f"(--no-source)): not read"], after["notes"]
    # the branch is not read from the new file: no line of it is taken for the run's
    summaries = " ".join(f["summary"] for f in after["findings"])
    assert "for step in range" not in summaries and "import" not in summaries, summaries
    assert not any(f["ranks"] == [1] for f in after["findings"]), summaries


def _keeper(run_dir: Path, keep: bool = True) -> sources._Keeper:
    k = sources._Keeper.__new__(sources._Keeper)
    k.run_dir, k.keep = run_dir, keep
    return k


def test_copies_are_bounded_a_file_and_a_run(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "KEEP_FILE_BYTES", 1000)
    monkeypatch.setattr(sources, "KEEP_RUN_BYTES", 2500)
    files = []
    for i, size in enumerate([900, 1200, 900, 900]):
        f = tmp_path / f"f{i}.py"
        f.write_bytes(b"#" * (size - 1) + bytes([48 + i]))
        files.append(str(f))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _keeper(run_dir)._record(files)
    m = sources.read_manifest(run_dir)
    got = [m["files"][f] for f in files]
    assert [("copy" in e) for e in got] == [True, False, True, False]
    assert "a file" in got[1]["why"] and "a run" in got[3]["why"]
    assert m["kept_bytes"] == 1800
    assert all(e["sha256"] and e["size"] for e in got)  # hashed, kept or not


def test_a_frameworks_file_is_kept_by_version_not_content(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    from importlib import metadata, util

    torch_dir = util.find_spec("torch").submodule_search_locations[0]  # (not imported)
    torch_file = f"{torch_dir}/distributed/distributed_c10d.py"
    _keeper(run_dir)._record([torch_file])
    entry = sources.read_manifest(run_dir)["files"][torch_file]
    assert entry == {"library": "torch", "version": metadata.version("torch")}
    assert not list((run_dir / "sources").glob("*.src"))
    assert sources.library_of(json.__file__)[0] == "python"


def test_the_ranks_of_a_node_keep_each_file_once(tmp_path):
    files = []
    for i in range(30):
        f = tmp_path / f"m{i}.py"
        f.write_text(f"x = {i}\n")
        files.append(str(f))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    keepers = [_keeper(run_dir) for _ in range(8)]
    threads = [threading.Thread(target=k._record, args=(files[i % 3:] + files[:i % 3],))
               for i, k in enumerate(keepers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    m = sources.read_manifest(run_dir)
    assert sorted(m["files"]) == sorted(files)
    copies = sorted(p.name for p in (run_dir / "sources").glob("*.src"))
    assert len(copies) == 30 and m["kept_bytes"] == sum(Path(f).stat().st_size for f in files)
    assert not [p for p in (run_dir / "sources").iterdir() if p.name.endswith(".tmp")]
    for f in files:
        assert kept.KeptSources(run_dir).text(f) == (True, Path(f).read_text())


def test_noting_never_raises_and_keeps_nothing_off(tmp_path, monkeypatch):
    monkeypatch.setenv(sources.ENV, "0")
    assert not sources.enabled()
    sources.note(object(), {"file": 3})  # a ring without a path: nothing happens
    sources.note(None, None)


def test_no_file_is_written_through_a_link_in_the_run_dir(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "sources").symlink_to(elsewhere)
    f = tmp_path / "job.py"
    f.write_text("x = 1\n")
    _keeper(run_dir)._record([str(f)])
    assert not list(elsewhere.iterdir())
    (run_dir / "sources").unlink()
    (run_dir / "sources").mkdir()
    (run_dir / "sources" / ".lock").symlink_to(elsewhere / "lock")
    try:
        _keeper(run_dir)._record([str(f)])
    except OSError:
        pass  # (the keeper thread swallows it: the run keeps nothing)
    assert not list(elsewhere.iterdir())
    assert sources.read_manifest(run_dir) is None


def test_without_a_copy_the_disk_is_read_only_while_it_is_the_runs(tmp_path):
    f = tmp_path / "job.py"
    f.write_text("x = 1\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _keeper(run_dir, keep=False)._record([str(f)])
    assert kept.KeptSources(run_dir).text(str(f)) == (True, "x = 1\n")
    f.write_text("x = 2\n")
    reader = kept.KeptSources(run_dir)
    assert reader.text(str(f)) == (True, None)
    assert reader.text(str(f)) == (True, None) and len(reader.notes) == 1  # said once
    f.unlink()
    os.mkfifo(f)  # never a wait on whatever is at the path now
    assert kept.KeptSources(run_dir).text(str(f)) == (True, None)
    assert kept.KeptSources(run_dir).text(str(tmp_path / "other.py")) == (False, None)
