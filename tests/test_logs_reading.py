"""Reading logs in every shape real jobs print them (distdoctor/logs/lines.py, reader.py).

What a user sees through `diagnose --log`: the right rank, host and message for each line
whatever prefixes, colours, redraws, wraps and files it came in; every line that holds an
anchor found, fast path and exact path alike; bad input refused in one line.
"""

from __future__ import annotations

import gzip
import os

import pytest

from distdoctor.errors import UserError
from distdoctor.logs.lines import (
    LogLine,
    parse_line,
    parse_raw,
    split_interleaved,
    split_segments,
)
from distdoctor.logs.reader import LogReader
from distdoctor.logs.wraps import detect_width
from tests import logshapes

WATCHDOG = ("[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, "
            "OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran "
            "for 600060 milliseconds before timing out.")
ANCHORS = (b"atchdog", b"rror", b"NCCL", b"Traceback", b"imed out")


def fixture_log(ranks: int = 4, steps: int = 30) -> str:
    """A job of `ranks` ranks: progress lines, then every rank but the last times out."""
    lines = [f"[rank{r}]:host{r // 2}:{100 + r}:{200 + r} [{r % 2}] NCCL INFO Bootstrap : "
             f"Using eth0:10.0.0.{r}<0>" for r in range(ranks)]
    for s in range(steps):
        lines += [f"[rank{r}]:step {s} | loss {2.5 - s / 100:.4f} | lr 3.0e-04 | tokens/s "
                  f"{9000 + r} | a long enough line to make wrapping matter here"
                  for r in range(ranks)]
    lines += [f"[rank{r}]:[E501 10:00:00.123456789 ProcessGroupNCCL.cpp:632] "
              + WATCHDOG.format(r=r) for r in range(ranks - 1)]
    return "\n".join(lines) + "\n"


def read(paths, anchors=ANCHORS, **kw) -> tuple[LogReader, list[LogLine]]:
    r = LogReader([str(p) for p in paths], **kw)
    return r, list(r.lines(anchors))


def write(tmp_path, name: str, data: str | bytes):
    p = tmp_path / name
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return p


# --- one line at a time ----------------------------------------------------------------------
@pytest.mark.parametrize("line, want", [
    ("[rank3]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught",
     (3, None, None, None, "E", "[Rank 3] Watchdog caught")),
    ("[rank0]:   File \"train.py\", line 3", (0, None, None, None, None, '  File "train.py", line 3')),
    ("[default3]:hello", (None, 3, None, None, None, "hello")),
    ("[trainer12]:hello", (None, 12, None, None, None, "hello")),
    ("[80746] [rank5]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 0] x",
     (5, None, None, 80746, "E", "[PG 1 Rank 0] x")),
    ("E0330 21:37:34.807000 140012 torch/distributed/elastic/multiprocessing/api.py:869] "
     "failed (exitcode: -9) local_rank: 3 (pid: 77)",
     (None, None, None, 140012, "E", "failed (exitcode: -9) local_rank: 3 (pid: 77)")),
    ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1)",
     (None, None, None, None, "ERROR", "failed (exitcode: 1)")),
    ("[2024-05-01 10:00:00,123] [INFO] [launch.py:315:main] WORLD INFO DICT",
     (None, None, None, None, "INFO", "WORLD INFO DICT")),
    ("2024-05-01T10:00:00.123Z [rank2]:hello", (2, None, None, None, None, "hello")),
    ("(RayWorkerWrapper pid=581, ip=10.0.0.5) k8s17:581:581 [0] NCCL INFO Channel 00 "
     "[repeated 7x across cluster]", (None, None, "10.0.0.5", 581, None, "NCCL INFO Channel 00")),
    ("(Engine pid=1088) (RayWorkerWrapper pid=285, ip=10.0.0.6) x",
     (None, None, "10.0.0.6", 285, None, "x")),
    ("(pid=37108) NCCL DEBUG SET", (None, None, None, 37108, None, "NCCL DEBUG SET")),
    ("(raylet) A worker died", (None, None, None, None, None, "A worker died")),
    ("[1,3]<stderr>:Traceback (most recent call last):",
     (3, None, None, None, None, "Traceback (most recent call last):")),
    ("3: [rank3]:boom", (3, None, None, None, None, "boom")),
    ("3: boom", (3, None, None, None, None, "boom")),
    ("1: [default2]:boom", (None, 2, "node1", None, None, "boom")),
    ("node1: [2024-05-01 10:00:00,123] [INFO] [launch.py:315:main] x",
     (None, None, "node1", None, "INFO", "x")),
    ("10.1.2.3: hello", (None, None, "10.1.2.3", None, None, "hello")),
    ("host1:1234:1240 [0] NCCL INFO Bootstrap : Using eth0",
     (None, None, "host1", 1234, None, "NCCL INFO Bootstrap : Using eth0")),
    ("node1:1234:1234 [0] misc/socket.cc:484 NCCL WARN Connect failed",
     (None, None, "node1", 1234, None, "misc/socket.cc:484 NCCL WARN Connect failed")),
    ("[W socket.cpp:663] [c10d] The client socket has failed to connect",
     (None, None, None, None, "W", "[c10d] The client socket has failed to connect")),
    ("[PG ID 0 PG GUID 0(default_pg) Rank 6] Exception",
     (6, None, None, None, None, "[PG ID 0 PG GUID 0(default_pg) Rank 6] Exception")),
    ("[PG ID 2 PG GUID 9 Rank 4] Exception",  # a subgroup's rank is not the global one
     (None, None, None, None, None, "[PG ID 2 PG GUID 9 Rank 4] Exception")),
    ("RuntimeError: CUDA error: out of memory",
     (None, None, None, None, None, "RuntimeError: CUDA error: out of memory")),
    ("torch.distributed.DistBackendError: NCCL error",
     (None, None, None, None, None, "torch.distributed.DistBackendError: NCCL error")),
])
def test_prefix_shapes(line, want):
    ll = parse_line(line)
    assert (ll.rank, ll.local_rank, ll.host, ll.pid, ll.level, ll.text) == want


def test_nested_prefixes_and_ansi():
    ll = parse_line("\x1b[32m3: [default3]:\x1b[0m[rank11]:[E1123 10:37:34.6 ProcessGroupNCCL.cpp:1234]"
                    " [PG ID 0 PG GUID 0(default_pg) Rank 11] \x1b[31mtimeout\x1b[0m")
    assert (ll.rank, ll.local_rank, ll.host, ll.level) == (11, 3, "node3", "E")
    assert ll.text == "[PG ID 0 PG GUID 0(default_pg) Rank 11] timeout"
    assert ll.who == ("rank", 11)


def test_who_and_caller_identity():
    assert parse_line("[default2]:x", host="n7").who == ("local", "n7", 2)
    assert parse_line("host9:55:56 [0] NCCL INFO x").who == ("pid", "host9", 55)
    assert parse_line("plain").who is None
    # the caller's rank (live launcher, per-rank file) holds unless the line says otherwise
    assert parse_line("plain", rank=4).who == ("rank", 4)
    assert parse_line("[rank6]:x", rank=4).rank == 6


def test_parse_never_raises():
    # (its cost per line is measured in benchmarks/log_throughput.py, not here)
    for junk in ["", "\x00\x00", "[", "(", "[rank]:", "3:", "\x1b[", "[1,]<stderr>:", "é" * 5]:
        assert isinstance(parse_line(junk), LogLine)


def test_segments_and_interleaving():
    assert split_segments("a 10%\ra 20%\r[rank1]:RuntimeError: x\r\n") == [
        "a 10%", "a 20%", "[rank1]:RuntimeError: x"]
    assert split_segments("\r\n") == []
    assert split_interleaved("[rank1]:foo[rank2]:bar") == ["[rank1]:foo", "[rank2]:bar"]
    assert split_interleaved("3: [default1]:a[default2]:b") == ["3: [default1]:a", "3: [default2]:b"]
    assert split_interleaved("[default3]:[rank3]:x") == ["[default3]:[rank3]:x"]
    got = parse_raw("[rank1]:step 3[rank2]:[E1123 10:00:00.1 x.cpp:1] Watchdog caught")
    assert [(ll.rank, ll.text) for ll in got] == [(1, "step 3"), (2, "Watchdog caught")]


# --- the reader --------------------------------------------------------------------------
def check_watchdogs(r: LogReader, hits: list[LogLine], ranks: int = 4, cut: bool = False):
    dog = [ll for ll in hits if "Watchdog caught" in ll.text]
    assert sorted(ll.rank for ll in dog) == list(range(ranks - 1))
    for ll in dog[:-1] if cut else dog:  # a line cut short still says who reported
        assert ll.text.endswith("before timing out."), ll.text
        assert "SeqNum=1580" in ll.text
    assert {("rank", i) for i in range(ranks)} <= set(r.activity)


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("shape", sorted(logshapes.ALL_TEXT_SHAPES))
def test_every_shape_keeps_ranks_and_messages(tmp_path, shape, exact):
    text = logshapes.ALL_TEXT_SHAPES[shape](fixture_log())
    r, hits = read([write(tmp_path, "job.log", text)], exact=exact)
    check_watchdogs(r, hits, cut=shape == "cut_end")
    if shape.startswith("wrap"):
        assert r.wrapped_width == int(shape[4:])
    assert r.truncated == (shape == "cut_end")


def test_progress_redraws_last_text_and_glued_error(tmp_path):
    text = ("[rank0]:Running tokenizer:  10%\rRunning tokenizer:  55%\n"
            "[rank1]:Map: 10%\r[rank1]:RuntimeError: boom\n")
    for exact in (False, True):
        r, hits = read([write(tmp_path, "p.log", text)], exact=exact)
        assert [(ll.rank, ll.text) for ll in hits] == [(1, "RuntimeError: boom")]
        assert r.activity[("rank", 0)].last_text == "Running tokenizer:  55%"


def test_crlf_invalid_utf8_nul_and_cut_end(tmp_path):
    data = logshapes.invalid_utf8(logshapes.crlf(fixture_log()))
    p = write(tmp_path, "bad.log", data[:-30])  # the end cut off mid-line
    for exact in (False, True):
        r, hits = read([p], exact=exact)
        assert r.truncated
        assert all("\r" not in ll.text and "\x00" not in ll.text for ll in hits)
        assert sorted(ll.rank for ll in hits if "Watchdog" in ll.text) == [0, 1, 2]


@pytest.mark.parametrize("width", [80, 100, 120])
def test_wrap_detected_and_rejoined(tmp_path, width):
    text = logshapes.wrap(fixture_log(), width)
    lines = text.splitlines()
    assert any(len(s) == width and s[-1].isalnum() and n[:1].isalnum()
               for s, n in zip(lines, lines[1:], strict=False))  # a token cut mid-word
    r, hits = read([write(tmp_path, "w.log", text)])
    assert r.wrapped_width == width
    check_watchdogs(r, hits)
    assert r.total_lines == len(fixture_log().splitlines())


def test_no_false_wrap_for_repeated_messages():
    same = [f"[rank{r}]:" + "W" * 90 for r in range(8)]  # one message from many ranks
    assert detect_width(same + ["short"] * 20) is None
    assert detect_width(["x" * 200, "y" * 30] * 5) is None


def test_interleaved_lines_in_a_file(tmp_path):
    r, hits = read([write(tmp_path, "i.log", logshapes.interleave(fixture_log()))])
    check_watchdogs(r, hits)


def test_per_rank_files_glob_and_gzip(tmp_path):
    text = fixture_log()
    paths = logshapes.split_per_rank(text, tmp_path / "a", "slurm-4242-{rank}.out")
    logshapes.gzip_to(paths[1])
    os.remove(paths[1])
    r, hits = read([tmp_path / "a" / "slurm-4242-*"])
    assert len(r.files) == 4 and r.files[1].endswith("slurm-4242-1.out.gz")
    check_watchdogs(r, hits)
    assert r.activity[("rank", 3)].lines == 31  # NCCL line + 30 steps, no timeout
    # names saying rank: taken whatever the rest of the name
    paths = logshapes.split_per_rank(text, tmp_path / "b", "job-rank-{rank}.log")
    r, hits = read([tmp_path / "b" / "*.log"])
    check_watchdogs(r, hits)


def test_per_node_files_with_local_ranks(tmp_path):
    for node in range(2):
        lines = [f"[default{k}]:step {s}" for s in range(3) for k in range(2)]
        lines.append(f"[default1]:RuntimeError: rank on node {node}")
        write(tmp_path, f"out-{node}.log", "\n".join(lines) + "\n")
    r, hits = read([tmp_path / "out-*.log"])
    assert [(ll.host, ll.local_rank) for ll in hits] == [("node0", 1), ("node1", 1)]
    assert r.activity[("local", "node1", 0)].lines == 3


def test_anchor_never_lost_across_chunks(tmp_path):
    text = fixture_log(ranks=3, steps=5) + "tail with an Error at the very end"
    p = write(tmp_path, "c.log", text)
    want = None
    for chunk in (7, 64, 100, 1 << 20):
        r, hits = read([p], chunk_size=chunk)
        got = [(ll.lineno, ll.rank, ll.text) for ll in hits]
        want = want or got
        assert got == want
        assert got[-1] == (text.count("\n") + 1, None, "tail with an Error at the very end")
    exact = read([p], exact=True)[1]
    assert [(ll.lineno, ll.rank, ll.text) for ll in exact] == want


def test_fast_and_exact_agree_on_activity(tmp_path):
    text = fixture_log(ranks=6) + "host3:9:9 [0] NCCL INFO unprefixed\n[rank2]:late line\n"
    p = write(tmp_path, "a.log", text)
    fast, exact = read([p], chunk_size=512)[0], read([p], exact=True)[0]
    def table(r):
        return {w: (a.lines, a.first_lineno, a.last_lineno, a.last_text)
                for w, a in r.activity.items()}
    assert table(fast) == table(exact)
    assert fast.total_lines == exact.total_lines == text.count("\n")
    assert table(fast)[("rank", 2)][2:] == (text.count("\n"), "late line")


@pytest.mark.parametrize("spec, why", [
    ("missing.log", "not found"),
    ("adir", "is a directory"),
    ("nothing-*.log", "no log file matches"),
])
def test_bad_input_one_line(tmp_path, spec, why):
    (tmp_path / "adir").mkdir()
    with pytest.raises(UserError) as e:
        LogReader([str(tmp_path / spec)])
    assert why in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 2


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads anything")
def test_unreadable_file(tmp_path):
    p = write(tmp_path, "secret.log", "x\n")
    p.chmod(0)
    with pytest.raises(UserError, match="cannot read log"):
        LogReader([str(p)])


def test_empty_and_gzip_cut_short(tmp_path):
    r, hits = read([write(tmp_path, "empty.log", "")])
    assert (hits, r.total_lines, r.truncated) == ([], 0, False)
    blob = gzip.compress(fixture_log().encode())
    r, hits = read([write(tmp_path, "cut.log.gz", blob[: len(blob) // 2])])
    assert r.truncated


def test_a_runner_relaying_stderr_is_peeled():
    (line,) = parse_raw("stderr: [rank3]: Traceback (most recent call last):")
    assert (line.rank, line.text) == (3, "Traceback (most recent call last):")


def test_a_wrap_whose_trailing_spaces_a_copy_dropped_is_still_rejoined(tmp_path):
    text = logshapes.wrap(fixture_log(), 80)
    stripped = "\n".join(line.rstrip(" ") for line in text.split("\n"))
    r, hits = read([write(tmp_path, "w.log", stripped)])
    assert r.wrapped_width == 80
    check_watchdogs(r, hits)


def test_the_slow_paths_remembered_anchor_test_is_the_plain_test():
    """Lines that differ only in digits share one answer; an anchor with a digit in it, a
    long line and a full memory are tested each time: the same answer as testing every
    anchor in every line."""
    from distdoctor.logs import reader
    from distdoctor.logs.families import ANCHORS

    texts = tuple(a.decode() for a in ANCHORS)
    holds = reader._Holds(texts)
    lines = ["step 1 loss 0.5", "step 2 loss 0.7", "C10d store said 3", "Cd store said 4",
             "C11d store", "NCCL WARN 1", "NCCL WARN 2", "#1 store", "x" * 2000 + " NCCL",
             "x" * 2000, "step 3 loss 0.9 Watchdog"]
    for _ in range(2):
        for text in lines * 3:
            assert holds(text) == any(t in text for t in texts), text
        holds.memory.update({str(i).encode(): False for i in range(reader.MEMO)})


def test_the_scanners_remembered_routes_are_every_family_whose_anchor_a_line_holds():
    """Lines that differ only in digits share a remembered route; an anchor with a digit
    ("C10d store") is left to test on the line itself: each line reaches the families whose
    anchors it holds, whichever line of its masked shape came first."""
    from distdoctor.logs.scanner import LogScanner

    scanner = LogScanner()
    lines = ["C11d store failed", "C10d store failed", "C11d store failed",
             "Watchdog caught 3", "Watchdog caught 4 C10d store", "x" * 1100 + "C10d store"]
    for text in lines:
        read = [f for f, a in scanner._readers(text)
                if a is None or any(x in text for x in a)]
        want = [f for f, a in scanner._routes
                if ("NCCL INFO" not in text or not f.orchestrator)
                and any(x in text for x in a)]
        assert read == want, text
