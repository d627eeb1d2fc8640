"""A pack is someone else's file: crafted ones, against the real reading commands.

Each pack is built from a real one (a 2-rank job, packed) with one thing changed, the way
runlog/unpack.py reads the format: every check a reader makes first (CRC-32 per entry,
SHA-256 of the whole) is made to pass, so what is tested is what lies behind them. Before
these checks, a 3.5 KB pack held `diagnose` for minutes (a string table of zeros) or made
it take 2-6 GB (a ring window, or run.json as a sparse log, wider than the pack), a
header naming another rank was a traceback in `export`, a pack could fill the temp dir's
disk, and SIGTERM left the unpacked run dir behind."""

from __future__ import annotations

import hashlib
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from conftest import run_cli, run_job

HEAD, ENTRY, META = struct.Struct("<8sII"), struct.Struct("<BBHIQQ"), struct.Struct("<QQQQ")
FILE, RING, END = 1, 2, 3
STATIC = struct.Struct("<8sIIIQQQQiI")  # the log header's fixed part (runlog/format.py)
OFF_HEAD, OFF_STRINGS_USED, HEADER = 128, 136, 4096


def entries(pack: Path) -> list[tuple[int, str, bytes]]:
    b, at, out = pack.read_bytes(), HEAD.size, []
    while True:
        kind, _, name_len, _, _, stored = ENTRY.unpack_from(b, at)
        at += ENTRY.size
        if kind == END:
            return out
        name = b[at:at + name_len].decode()
        at += name_len
        out.append((kind, name, zlib.decompress(b[at:at + stored])))
        at += stored


def build(path: Path, items) -> Path:
    body = HEAD.pack(b"DDOCPACK", 1, 0)
    for kind, name, raw in items:
        stored = zlib.compress(raw, 9)
        body += ENTRY.pack(kind, 0, len(name), zlib.crc32(raw), len(raw), len(stored))
        body += name.encode() + stored
    path.write_bytes(body + ENTRY.pack(END, 0, 0, 0, len(items), 32)
                     + hashlib.sha256(body).digest())
    return path


def with_log(good: Path, out: Path, change) -> Path:
    """`good` with rank 0's log entry passed through change(full, first, n, used, head,
    strings, columns) -> the same seven."""
    items = []
    for kind, name, raw in entries(good):
        if kind == RING and name == "ranks/rank-00000.ring":
            full, first, n, used = META.unpack_from(raw, 0)
            head = bytearray(raw[META.size:META.size + HEADER])
            at = META.size + HEADER
            parts = change(full, first, n, used, head, raw[at:at + used], raw[at + used:])
            full, first, n, used, head, strings, cols = parts
            raw = META.pack(full, first, n, used) + bytes(head) + strings + cols
        items.append((kind, name, raw))
    return build(out, items)


def set_static(head: bytearray, **fields) -> None:
    names = ("magic", "version", "header_size", "slot_size", "capacity", "s_off", "s_size",
             "r_off", "rank", "pid")
    values = dict(zip(names, STATIC.unpack_from(head, 0), strict=True))
    values.update(fields)
    STATIC.pack_into(head, 0, *values.values())


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("pack")
    assert run_job("many_ops.py", 2, tmp / "run", "5").returncode == 0
    assert run_cli(["pack", str(tmp / "run"), "-o", str(tmp / "good.ddpack")]).returncode == 0
    return tmp / "good.ddpack"


def _refused(args, timeout: float = 60, **kw) -> str:
    res = run_cli(args, timeout=timeout, **kw)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "a bug in distdoctor" not in res.stderr, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    return lines[0]


def test_a_string_table_the_pack_does_not_carry_is_refused(good, tmp_path):
    def bigger(full, first, n, used, head, strings, cols):
        s_off, size = HEADER, 16 << 20  # the header claims 16 MiB of strings
        set_static(head, s_size=size, r_off=s_off + size)
        struct.pack_into("<Q", head, OFF_STRINGS_USED, size)
        capacity = STATIC.unpack_from(head, 0)[4]
        return s_off + size + capacity * 128, first, n, used, head, strings, cols

    pack = with_log(good, tmp_path / "x.ddpack", bigger)
    assert "do not add up" in _refused(["diagnose", str(pack)])


def test_a_string_table_of_zeros_is_read_in_a_moment(good, tmp_path):
    """Carried whole and consistent: 32 MiB of zeros (70 KB packed) took 28 s to read."""
    def zeros(full, first, n, used, head, strings, cols):
        size = 32 << 20
        capacity = STATIC.unpack_from(head, 0)[4]
        set_static(head, s_size=size, r_off=HEADER + size)
        struct.pack_into("<Q", head, OFF_STRINGS_USED, size)
        padded = strings + bytes(size - len(strings))
        return HEADER + size + capacity * 128, first, n, size, head, padded, cols

    pack = with_log(good, tmp_path / "x.ddpack", zeros)
    res = run_cli(["diagnose", str(pack)], timeout=20)  # (0.2 s now)
    assert "Traceback" not in res.stderr, res.stderr[-2000:]


def test_a_ring_window_wider_than_the_pack_is_refused(good, tmp_path):
    def wide(full, first, n, used, head, strings, cols):
        capacity = 15_000_000  # 1.9 GB of slots, read in one piece
        set_static(head, capacity=capacity)
        struct.pack_into("<Q", head, OFF_HEAD, capacity)
        rows = bytearray(n * 128)  # its n events renumbered to end at the new head
        for j in range(128):
            rows[j::128] = cols[j * n:(j + 1) * n]
        first = capacity - n
        for i in range(n):
            struct.pack_into("<Q", rows, i * 128, first + i + 1)
        cols = b"".join(bytes(rows[j::128]) for j in range(128))
        r_off = STATIC.unpack_from(head, 0)[7]
        return r_off + capacity * 128, first, n, used, head, strings, cols

    pack = with_log(good, tmp_path / "x.ddpack", wide)
    assert "do not add up" in _refused(["diagnose", str(pack)])


def test_a_log_under_another_files_name_is_refused(good, tmp_path):
    items = [(k, n, r) for k, n, r in entries(good) if n != "run.json"]
    ring = next(r for k, n, r in items if k == RING)
    pack = build(tmp_path / "x.ddpack", [*items, (RING, "run.json", ring)])
    assert "not a rank's log" in _refused(["show", str(pack)])


def test_a_log_naming_another_rank_is_refused_in_a_pack_and_left_out_of_a_run_dir(good,
                                                                                  tmp_path):
    def other(full, first, n, used, head, strings, cols):
        set_static(head, rank=128)
        return full, first, n, used, head, strings, cols

    pack = with_log(good, tmp_path / "x.ddpack", other)
    assert "another rank's log" in _refused(["export", str(pack), "--perfetto",
                                             str(tmp_path / "t.json")])
    run_dir = tmp_path / "run"  # the same file in a run dir: that rank is left out
    run_dir.mkdir()
    subprocess.run([sys.executable, "-c", "import sys; from distdoctor.runlog.unpack import "
                    "unpack; unpack(sys.argv[1], sys.argv[2])", str(good), str(run_dir)],
                   check=True, timeout=60)
    ring = run_dir / "ranks" / "rank-00000.ring"
    with open(ring, "r+b") as f:
        head = bytearray(f.read(HEADER))
        set_static(head, rank=128)
        f.seek(0)
        f.write(head)
    for args in (["export", str(run_dir), "--perfetto", str(tmp_path / "t.json")],
                 ["diagnose", str(run_dir)], ["show", str(run_dir)]):
        res = run_cli(args, timeout=60)
        assert "Traceback" not in res.stderr and "a bug in" not in res.stderr, res.stderr
        assert "says it is rank 128" in res.stderr + res.stdout, (args, res.stdout)


def test_a_run_json_that_is_not_text_is_one_line(good, tmp_path):
    items = [(k, n, b"\xff\xfe{" if n == "run.json" else r) for k, n, r in entries(good)]
    line = _refused(["diagnose", str(build(tmp_path / "x.ddpack", items))])
    assert "run.json" in line


def test_a_log_entry_of_zeros_is_refused_before_it_is_held(good, tmp_path):
    items = [(k, n, bytes(256 << 20) if k == RING and n.endswith("00000.ring") else r)
             for k, n, r in entries(good)]
    pack = build(tmp_path / "x.ddpack", items)  # ~250 KB: 256 MiB of zeros inflated
    code = ("import resource, subprocess, sys\n"
            "r = subprocess.run([sys.executable, '-m', 'distdoctor', 'diagnose', sys.argv[1]],"
            " capture_output=True, text=True, timeout=120)\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
            "print(r.returncode, r.stderr[-2000:])\n")
    out = subprocess.run([sys.executable, "-c", code, str(pack)], capture_output=True,
                         text=True, timeout=150, stdin=subprocess.DEVNULL).stdout
    rss_kb = int(out.split("\n", 1)[0])
    assert rss_kb < 150_000 and "no log this distdoctor reads" in out, out  # 300 MB before


def test_sigterm_while_a_pack_lies_unpacked_removes_it(good, tmp_path):
    items = [*entries(good), (FILE, "big.json", bytes(256 << 20))]  # slow to write out
    pack = build(tmp_path / "x.ddpack", items)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "distdoctor", "diagnose", str(pack)],
                            env=dict(os.environ, TMPDIR=str(tmpdir)), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not list(tmpdir.glob("ddpack-*")) and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not list(tmpdir.glob("ddpack-*")), err
    assert b"Traceback" not in err, err


def test_sigterm_just_as_the_temp_dir_is_made_removes_it(good, tmp_path):
    # the signal lands the instant mkdtemp returns (CI met it there once by chance: the
    # handler was set only after the dir was made, and SIGTERM's default left it behind)
    code = ("import os, runpy, signal, sys, tempfile\n"
            "made = tempfile.mkdtemp\n"
            "def mkdtemp(*a, **k):\n"
            "    d = made(*a, **k)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    return d\n"
            "tempfile.mkdtemp = mkdtemp\n"
            "sys.argv = ['distdoctor', 'diagnose', sys.argv[1]]\n"
            "runpy.run_module('distdoctor', run_name='__main__')\n")
    _ends_on_sigterm_leaving_nothing(code, good, tmp_path)


def test_sigterm_while_the_unpacked_dir_is_removed_removes_it_all(good, tmp_path):
    # the signal lands as the removal starts (a GiB pack's takes a while): it cut the
    # removal short, and the rest of the dir stayed in the temp dir
    code = ("import os, runpy, signal, sys\n"
            "def hook(event, args):\n"
            "    if event == 'shutil.rmtree' and 'ddpack-' in str(args[0]):\n"
            "        os.kill(os.getpid(), signal.SIGTERM)\n"
            "sys.addaudithook(hook)\n"
            "sys.argv = ['distdoctor', 'diagnose', sys.argv[1]]\n"
            "runpy.run_module('distdoctor', run_name='__main__')\n")
    _ends_on_sigterm_leaving_nothing(code, good, tmp_path)


def _ends_on_sigterm_leaving_nothing(code: str, pack: Path, tmp_path: Path) -> None:
    """`code` (which diagnoses the pack given it, signalling itself) ends as SIGTERM
    ends it, with no unpacked dir left in its temp dir."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    r = subprocess.run([sys.executable, "-c", code, str(pack)], capture_output=True,
                       env=dict(os.environ, TMPDIR=str(tmpdir)), stdin=subprocess.DEVNULL,
                       timeout=60)
    assert r.returncode == 128 + signal.SIGTERM, r
    assert not list(tmpdir.glob("ddpack-*")), r.stderr
    assert b"Traceback" not in r.stderr, r.stderr


def test_a_pack_that_would_fill_the_temp_disk_is_refused(good, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(mnt)],
                      capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        items = [*entries(good), (FILE, "big.json", bytes(64 << 20))]
        pack = build(tmp_path / "x.ddpack", items)
        line = _refused(["diagnose", str(pack)], env={"TMPDIR": str(mnt)})
        assert "would fill the temp dir's disk" in line
        assert not os.listdir(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
