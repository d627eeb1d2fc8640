"""Multi-node: the collector's copy keeps the sources the nodes' ranks kept (issue 52), so
`diagnose` on the copy reads the program the job ran, with the job's script gone; and a
node cannot make the collector write anything else, anywhere else, or without bound."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import sys
import time

import pytest
from conftest import Lines, _kill_ranks, run_cli
from conftest import start_cli as _start
from conftest import stop_process as _stop
from test_pack import BRANCH_LINE, JOB

from distdoctor.collect import wire
from distdoctor.collect.server import Collector, listen
from distdoctor.collect.source_copies import SourceCopies, source_frame
from distdoctor.launch.env import free_port
from distdoctor.runlog import sources as S


def _diagnose(run_dir) -> list[dict]:
    proc = run_cli(["diagnose", str(run_dir), "--json"], timeout=60)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)["findings"]


@pytest.mark.timeout(120)
def test_the_collectors_copy_keeps_the_sources_and_reads_them_with_the_script_gone(tmp_path):
    """Two nodes of one rank each; rank 0 alone enters a barrier under an `if`. The copy
    holds sources/, and its diagnosis names that branch with job.py moved away."""
    script = tmp_path / "src" / "job.py"
    script.parent.mkdir()
    script.write_text(JOB)
    port, master = free_port(), free_port()
    copy = tmp_path / "copy"
    collector = _start(["watch", "--listen", f"127.0.0.1:{port}", str(copy)])
    said = Lines(collector)
    nodes, node_dirs = [], [tmp_path / f"node{n}" for n in (0, 1)]
    try:
        said.wait_for("collecting on", 30)
        for node_rank, run_dir in enumerate(node_dirs):
            nodes.append(_start([  # a node of one rank: its env as a launcher's
                "run", "--run-dir", str(run_dir), "--forward", f"127.0.0.1:{port}",
                "--on-hang", "kill", "--grace", "1", "--hang-timeout", "2", "--",
                sys.executable, str(script)], env={
                    "RANK": str(node_rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master)}))
        for proc in nodes:
            proc.wait(90)
    finally:
        for proc in nodes:
            _stop(proc, timeout_s=10)
        for run_dir in node_dirs:
            _kill_ranks(run_dir)
        code = _stop(collector, timeout_s=15)
    assert code == 0 and "Traceback" not in "".join(said.lines), "".join(said.lines)
    sha = hashlib.sha256(JOB.encode()).hexdigest()
    kept = copy / S.DIR / f"{sha}.src"
    assert kept.read_text() == JOB
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE((copy / S.DIR).stat().st_mode) == 0o700
    manifest = json.loads((copy / S.DIR / S.MANIFEST).read_text())
    assert manifest["files"][str(script)]["copy"] == f"{sha}.src", manifest
    here = _diagnose(copy)
    away = script.with_name("job.py.away")
    script.rename(away)
    try:
        there = _diagnose(copy)
        (copy / S.DIR).rename(copy / "sources.off")  # the copy as it was without them
        without = _diagnose(copy)
    finally:
        away.rename(script)
    assert there == here
    mismatch = [f for f in there if f["kind"] == "mismatch"]
    assert mismatch and mismatch[0]["ranks"] == [0], there
    assert f"job.py:{BRANCH_LINE + 1}" in mismatch[0]["summary"], mismatch[0]["summary"]
    assert "`if step == 3 and rank == 0:`" in mismatch[0]["summary"]
    # (the copy as it was without them: the branch is not read)
    assert "`if step == 3" not in [f for f in without if f["kind"] == "mismatch"][0]["summary"]


def _manifest(files: dict) -> bytes:
    return json.dumps({**S.empty_manifest(), "files": files}).encode()


def _src(data: bytes) -> tuple[str, bytes]:
    return f"{hashlib.sha256(data).hexdigest()}.src", data


def test_the_copy_takes_only_its_names_within_its_bounds_and_never_through_a_link(tmp_path):
    (tmp_path / "copy").mkdir()
    copies = SourceCopies(tmp_path / "copy")
    apply = copies.apply

    def payload(name: str, data: bytes) -> bytes:
        return source_frame(name, data)[wire.FRAME.size:]

    for name, data in [("../escaped", b"x"), ("sources/../../x.src", b"x"),
                       (".lock", b"x"), ("a" * 64 + ".src", b"not that hash"),
                       ("manifest.json", b"[" * 100_000), ("manifest.json", b"{}"),
                       (_src(b"y" * (S.KEEP_FILE_BYTES + 1))[0],
                        b"y" * (S.KEEP_FILE_BYTES + 1))]:
        with pytest.raises(wire.WireError):
            apply(payload(name, data))
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "x.src").exists()
    # 9 distinct copies of 1 MiB: the copy keeps 8 MiB of them, and its manifest says why
    blobs = [_src(bytes([i]) * S.KEEP_FILE_BYTES) for i in range(9)]
    for name, data in blobs:
        apply(payload(name, data))
    apply(payload(S.MANIFEST, _manifest({
        f"/job/f{i}.py": {"sha256": name[:64], "size": len(data), "copy": name,
                          "odd": "dropped", "why": "\x1b[31mred"}
        for i, (name, data) in enumerate(blobs)})))
    folder = tmp_path / "copy" / S.DIR
    held = sorted(p.name for p in folder.iterdir())
    assert len(held) == 9 and S.MANIFEST in held  # 8 copies and the manifest
    assert sum(p.stat().st_size for p in folder.glob("*.src")) == S.KEEP_RUN_BYTES
    m = S.read_manifest(tmp_path / "copy")
    assert m["kept_bytes"] == S.KEEP_RUN_BYTES
    entries = [m["files"][f"/job/f{i}.py"] for i in range(9)]
    assert all("odd" not in e and "\x1b" not in e["why"] for e in entries)
    assert sum("copy" in e for e in entries) == 8
    # a second node naming the same path keeps the first's entry; a path that would not
    # print as itself is not taken
    apply(payload(S.MANIFEST, _manifest({"/job/f0.py": {"sha256": "b" * 64},
                                         "/job/\x1b[2Jx.py": {"sha256": "c" * 64}})))
    files = S.read_manifest(tmp_path / "copy")["files"]
    assert files["/job/f0.py"] == entries[0] and len(files) == 9
    copies.close()
    # a link where sources/ goes: nothing is written through it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "copy2").mkdir()
    (tmp_path / "copy2" / S.DIR).symlink_to(elsewhere)
    linked = SourceCopies(tmp_path / "copy2")
    linked.apply(payload(*_src(b"print(1)\n")))
    linked.apply(payload(S.MANIFEST, _manifest({})))
    linked.close()
    assert list(elsewhere.iterdir()) == []


@pytest.mark.timeout(30)
def test_a_collector_drops_a_node_that_sends_a_foreign_name_and_keeps_what_came_before(
        tmp_path):
    said: list[str] = []
    collector = Collector(tmp_path / "copy", listen(("127.0.0.1", 0)), None,
                          said.append).start()
    try:
        sock = socket.create_connection(collector.address, timeout=10)
        sock.sendall(wire.json_frame(wire.HELLO, {"format": wire.FORMAT, "host": "n1",
                                                  "version": wire.VERSION, "run": {}}))
        got = wire.read_frame(sock.makefile("rb").read, wire.MAX_HELLO)
        assert got[0] == wire.WELCOME and json.loads(got[3]) == {"sources": 1}
        name, data = _src(b"print('kept')\n")
        sock.sendall(source_frame(name, data) + source_frame("../../etc/x", b"x"))
        sock.settimeout(10)
        assert sock.recv(1) == b""  # dropped
        sock.close()
        kept = tmp_path / "copy" / S.DIR / name
        deadline = time.monotonic() + 10
        while not kept.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        collector.stop()
    assert kept.read_bytes() == data
    assert any("SOURCE frame names" in line for line in said), said
    assert not (tmp_path / "etc").exists() and sorted(os.listdir(kept.parent)) == [name]


@pytest.mark.timeout(30)
def test_a_node_sends_no_source_frame_to_a_collector_that_does_not_ask(tmp_path):
    """An older collector's WELCOME is empty, and it drops a node at a frame type it does
    not know: the node sends it none. One that asks gets the copy, then the manifest."""
    import threading

    from distdoctor.collect.forward import Forwarder
    from distdoctor.runlog import rundir

    node = tmp_path / "node"
    rundir.write_run_meta(node, launcher="test")
    name, data = _src(b"print('job')\n")
    (node / S.DIR).mkdir()
    (node / S.DIR / name).write_bytes(data)
    (node / S.DIR / S.MANIFEST).write_bytes(_manifest(
        {"/job.py": {"sha256": name[:64], "size": len(data), "copy": name}}))
    for welcome, want in ((b"", []), (b'{"sources": 1}', [name, S.MANIFEST])):
        server = socket.create_server(("127.0.0.1", 0))
        kinds: list = []

        def serve(server=server, welcome=welcome, kinds=kinds):
            conn, _ = server.accept()
            with conn:
                reader = conn.makefile("rb")
                wire.read_frame(reader.read, wire.MAX_HELLO)  # HELLO
                conn.sendall(wire.frame(wire.WELCOME, welcome))
                while (got := wire.read_frame(reader.read)) is not None:
                    kinds.append((got[0], got[3].partition(b"\n")[0].decode("latin-1")))

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        fwd = Forwarder(node, server.getsockname()[:2])
        fwd.tick()
        fwd.tick()  # (nothing new: nothing sent again)
        fwd.stop()
        thread.join(10)
        server.close()
        assert [n for k, n in kinds if k == wire.SOURCE] == want, kinds
