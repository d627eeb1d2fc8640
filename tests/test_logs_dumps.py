"""Stack dumps in a log (logs/dumps.py): where the job stood, from a whole dump, and no
frame claimed from dumps that several processes wrote at once and tore.

The fixtures in fixtures/logs/dumps/ were recorded on this machine by
tests/jobs/logstory/torn_dumps.py (two real ranks sent SIGUSR1 together) and by
`py-spy dump` of a real two-thread process; the live test below makes it happen again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from logtests import warned_of

from distdoctor.logs import scan_logs
from distdoctor.logs.dumps import read_last_dump
from distdoctor.logs.lines import parse_raw

DUMPS = Path(__file__).parent / "fixtures" / "logs" / "dumps"
sys.path.insert(0, str(Path(__file__).parent / "jobs" / "logstory"))
from torn_dumps import record, torn  # noqa: E402

STUCK = "stuck in _create_c10d_store"  # where both ranks really were
TORN = "tore each other's lines"


def _lines(path: Path) -> list:
    return [ll for n, text in enumerate(path.read_text().splitlines(), 1) if text.strip()
            for ll in parse_raw(text, file=str(path), lineno=n)]


def _said(path: Path) -> str:
    found, _ = scan_logs([str(path)])
    return warned_of(found)[0].summary


@pytest.mark.parametrize("name", ["torn_all_then_sigterm.log", "torn_all_at_the_end.log"])
def test_dumps_torn_throughout_claim_no_frame_and_say_why(name):
    log = DUMPS / name
    assert torn(log.read_text())
    dump = read_last_dump(_lines(log))
    assert dump.frames == [] and dump.torn and dump.heads == 2
    said = _said(log)
    assert f"2 stack dumps were printed at the same moment and {TORN}" in said, said
    assert "stuck in" not in said, said


@pytest.mark.parametrize("name", ["torn_after_a_whole_start_then_sigterm.log",
                                  "torn_after_a_whole_start_at_the_end.log"])
def test_a_stack_whole_before_the_tearing_began_is_read(name):
    """The first rank's head and innermost frames came out whole before the second rank
    began: those are one process' frames, innermost first, and say where it stood."""
    log = DUMPS / name
    assert torn(log.read_text())
    dump = read_last_dump(_lines(log))
    assert dump.torn and dump.frames[0]["function"] == "_create_c10d_store"
    assert STUCK in _said(log)


def test_a_stack_torn_by_another_fatal_error_keeps_its_whole_first_frames():
    """Two ranks aborted at once: the second's "Fatal Python error: Aborted" tore into the
    first's fourth frame. The three frames before it are the first rank's alone; the
    tearing line was taken for the job's own output after an older dump, and the log was
    said torn with nothing read (recorded by torn_dumps.py, abort)."""
    log = DUMPS / "torn_abort_after_a_whole_start.log"
    assert torn(log.read_text())
    dump = read_last_dump(_lines(log))
    assert dump.torn and dump.heads == 2
    assert [f["function"] for f in dump.frames] == [
        "_create_c10d_store", "_tcp_rendezvous_handler", "init_process_group"]
    assert STUCK in _said(log)


def test_a_fatal_error_whose_dump_tore_from_its_first_frame_says_so():
    """The launcher named one rank (it stopped the other), whose "Fatal Python error:
    Aborted" is the finding; its dump tore at its first frame: that is said, and no
    frame is claimed (before: the error alone, the torn dump unmentioned)."""
    log = DUMPS / "torn_abort_from_the_first_frame.log"
    assert torn(log.read_text())
    said = _said(log)
    assert "Fatal Python error: Aborted" in said and TORN in said, said
    assert "stuck in" not in said and " at " not in said.split("(its stack dump")[0], said


def test_py_spy_reads_the_main_thread_not_the_last_listed():
    """py-spy lists the main thread first: the job stood where it is (g), not in the
    thread listed after it (f)."""
    dump = read_last_dump(_lines(DUMPS / "py_spy_main_and_thread.txt"))
    assert [f["function"] for f in dump.frames] == ["g", "<module>"] and not dump.torn
    assert "stuck in g (<string>:5)" in _said(DUMPS / "py_spy_main_and_thread.txt")


def test_an_indented_py_spy_dump_is_read_not_said_torn(tmp_path):
    """The same dump pasted indented (a quoted excerpt): its heads are still whole heads;
    the reader took each for a torn one and said the dump tore."""
    text = "".join(("  " + t if t.startswith("Thread ") else t) + "\n" for t in
                   (DUMPS / "py_spy_main_and_thread.txt").read_text().splitlines())
    log = tmp_path / "indented.txt"
    log.write_text(text)
    dump = read_last_dump(_lines(log))
    assert [f["function"] for f in dump.frames] == ["g", "<module>"] and not dump.torn


@pytest.mark.timeout(420)
def test_two_real_ranks_dumping_at_once_never_name_a_frame_they_were_not_in(tmp_path):
    """Two torchrun ranks stuck in a store that never fills, sent SIGUSR1 together: their
    faulthandler dumps tear about every other run. A torn log's diagnosis names where
    they were or says the dumps tore, never another frame (the reader of before named
    `<module>`, or nothing)."""
    seen = 0
    for attempt in range(8):
        log = tmp_path / f"attempt{attempt}.log"
        if not record(log, stop=attempt % 3 == 0, abort=attempt % 3 == 2):
            continue
        seen += 1
        said = _said(log)
        assert STUCK in said or TORN in said, said
        assert "stuck in" not in said or STUCK in said, said
        if seen == 2:
            break
    if not seen:
        pytest.skip("no two dumps tore in 8 runs on this machine")


def test_a_dump_with_no_rank_prefix_is_printed_without_a_rank():
    """The report's call site of a log's dump: its place, not "rank None"; and what the
    lines before it repeat is the warning, not the C++ backtrace printed under it."""
    log = DUMPS / "torn_after_a_whole_start_at_the_end.log"
    out = subprocess.run([sys.executable, "-m", "distdoctor", "diagnose", "--log", str(log)],
                         capture_output=True, text=True, timeout=120).stdout
    assert "stuck in _create_c10d_store" in out and "rank None" not in out, out
    assert "frame #" not in _said(log)


@pytest.mark.timeout(120)
def test_two_ranks_dumping_at_once_through_torchrun_tee_are_read_by_their_prefixes(tmp_path):
    """With `--tee 3` each rank writes its own file and torchrun copies it out line by
    line as `[defaultN]:...`: whole lines, the two ranks' in turn. One rank's stack is
    read from its own lines, to the user's frame."""
    log = tmp_path / "tee.log"
    record(log, tee=True)
    text = log.read_text()
    assert "[default0]:" in text and "[default1]:" in text, text[-3000:]
    dump = read_last_dump(_lines(log))
    assert not dump.torn, dump
    assert [f["function"] for f in dump.frames][0] == "_create_c10d_store"
    assert dump.frames[-1]["function"] == "<module>"
    assert "called from main (logstory/story_job.py:" in _said(log)


def test_fatal_errors_torn_into_one_line_are_each_said_once():
    """Two ranks aborting at once wrote "Fatal Python error: " twice and "Aborted" twice
    into one line: the error is "Aborted" (the reader said "Fatal Python error: Fatal
    Python error: AbortedAborted")."""
    said = _said(DUMPS / "fatal_errors_torn_together.log")
    assert "Fatal Python error: Aborted" in said and "AbortedAborted" not in said, said
    assert said.count("Fatal Python error") == 1, said
