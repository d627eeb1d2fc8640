"""Numbers a node sends that no float holds, against a real collector (`distdoctor watch
--listen --metrics`) over loopback: one DIGEST frame with an op index of Infinity or 1e999,
an enter time of -10^400, a shape of 1e999, a heartbeat age or a wait of 10^400. Kept,
each raised later, far from its frame: it ended the collector's diagnosis thread for
good (no finding after it), made every /metrics scrape a 500, or dropped the honest node
whose frame met it. Each is refused with its frame, in one line, and the collector goes
on: two honest nodes' mismatch is still found, /metrics still answers, the honest node
stays. Each case failed on the code before its fix.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from simnode import CollectorProcess, connect_node, dropped, send, until  # noqa: E402

from distdoctor.collect import wire  # noqa: E402
from distdoctor.launch.env import free_port  # noqa: E402

POISON = "@poison@"  # where the raw JSON of a poisoned number goes
HUGE = "1" + "0" * 400  # an int no float holds
NOW_NS = 7_000_000_000_000  # the nodes' clock (each rank's own: never compared)


def _row(index: int, group: str, seq: int, op: str = "all_reduce", done: bool = True,
         t_enter: int = NOW_NS - 10**9) -> list:
    """An op as digest.event_row writes it."""
    return [index, "collective", op, "ok" if done else "in_flight", group, seq, None, [[4]],
            ["float32"], 4, 4, "sum", ["/job/train.py", 12, "step"], t_enter,
            t_enter + 1000 if done else None, None]


def _position(rank: int, latest=None, last_done=None, state=None) -> list:
    return [rank, latest, last_done, {}, NOW_NS, None, False, state or {}]


def _digest(host: str, ranks: list, poison: str = "", **parts) -> bytes:
    """A DIGEST frame; `poison`: the raw JSON put where a part holds POISON."""
    body = {"host": host, "ranks": ranks, "groups": {}, "sigs": {}, "arrivals": [],
            "waits": [], "dropped": 0, **parts}
    text = json.dumps(body).replace(json.dumps(POISON), poison)
    return wire.frame(wire.DIGEST, text.encode())


def _collector(tmp_path: Path) -> tuple[CollectorProcess, int]:
    port = free_port()
    c = CollectorProcess(tmp_path / "copy", tmp_path / "collector.txt",
                         args=("--metrics", f"127.0.0.1:{port}")).started()
    return c, port


def _metrics_status(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _metrics_text(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return r.read().decode()
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"


def _kinds(copy: Path) -> list[str]:
    try:
        return [f["kind"] for f in json.loads((copy / "findings.json").read_text())["findings"]]
    except (OSError, ValueError):  # (none yet, or not a file: the test put a directory)
        return []


def _mismatch_between_honest_nodes(c: CollectorProcess) -> list:
    """Nodes a and b (ranks 1 and 2, one group) enter its first collective with different
    ops: the collector names the mismatch once its diagnosis thread runs."""
    nodes = []
    for host, rank, op in (("honest-a", 1, "all_reduce"), ("honest-b", 2, "broadcast")):
        sock = connect_node(c.address, host)
        assert send(sock, _digest(host, [_position(rank)], groups={"g": ["d", [1, 2]]},
                                  sigs={"0": _row(0, "g", 0, op)},
                                  arrivals=[["g", 0, 0, [rank], 1]]))
        nodes.append(sock)
    return nodes


STUCK = NOW_NS - 60 * 10**9  # an op in flight for a minute: the hang detector decodes it


def _stuck(field: int, value) -> list:
    """A rank position whose newest op, in flight since STUCK, has `value` at `field`."""
    row = _row(5, "e", 5, done=False, t_enter=STUCK)
    row[field] = value
    return _position(0, row)


CASES = {  # name -> (the poisoned rank position, the raw JSON at its POISON)
    "op index Infinity": (_stuck(0, POISON), "Infinity"),
    "op index 1e999": (_stuck(0, POISON), "1e999"),
    "enter time -10^400": (_stuck(13, POISON), "-" + HUGE),
    "shape 1e999": (_stuck(7, [[POISON]]), "1e999"),
    "heartbeat age 10^400": (_position(0, state={"hb_age_s": POISON}), HUGE),
    "steps 10^400": (_position(0, state={"steps": POISON}), HUGE),
    "clock 10^400": ([0, _row(5, "e", 5, done=False), None, {}, POISON, None, False, {}],
                     HUGE),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(CASES))
def test_a_number_no_float_holds_is_refused_and_the_collector_goes_on(tmp_path, case):
    position, raw = CASES[case]
    c, metrics_port = _collector(tmp_path)
    try:
        evil = connect_node(c.address, "evil")
        assert send(evil, _digest("evil", [position], raw, groups={"e": ["d", [0]]}))
        honest = _mismatch_between_honest_nodes(c)
        until(lambda: "mismatch" in _kinds(tmp_path / "copy"), 20,
              f"the honest nodes' mismatch: {c.text()[-1500:]}")
        assert _metrics_status(metrics_port) == 200, c.text()[-1500:]
        assert dropped(evil, 10)
        text = c.text()
        lines = [x for x in text.splitlines() if "dropped node evil" in x]
        assert len(lines) == 1 and "DIGEST frame has" in lines[0], text[-1500:]
        assert "the collector's diagnosis" not in text and "Traceback" not in text, text
        for sock in [evil, *honest]:
            sock.close()
    finally:
        c.stop()


def _served(c: CollectorProcess, sock, host: str, timeout_s: float = 10) -> bool:
    """Whether the collector still takes `host`'s frames: a SAMPLES frame it sends is
    written into the copy (as node_mirror does, under the host's name)."""
    send(sock, wire.frame(wire.SAMPLES, b'{"t": 1}\n'))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any((c.out_path.parent / "copy").rglob(f"*{host}*")):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.timeout(60)
def test_a_wait_of_minus_10_400_is_refused_and_the_honest_node_stays(tmp_path):
    """A wait (the shortest among a node's members) of -10^400 was kept until the other
    node's wait of the same collective came, and the merge raised in THAT node's frame:
    the honest node was dropped. The poisoned frame is refused; the honest node stays."""
    c, _ = _collector(tmp_path)
    try:
        group = {"w": ["d", [0, 1]]}
        evil, honest = connect_node(c.address, "evil"), connect_node(c.address, "honest")
        assert send(evil, _digest("evil", [_position(0)], "-" + HUGE, groups=group,
                                  waits=[["w", 0, 1, POISON, 0, None, ["all_reduce", 4]]]))
        time.sleep(0.2)  # (the evil node's frame taken in first, as a slower node's)
        assert send(honest, _digest("honest", [_position(1)], groups=group,
                                    waits=[["w", 0, 1, 2_000_000, 1, None, ["all_reduce", 4]]]))
        assert _served(c, honest, "honest"), c.text()[-1500:]
        assert dropped(evil, 10)
        text = c.text()
        assert "dropped node honest" not in text and "lost node honest" not in text, text
        assert "dropped node evil" in text and "wait" in text, text
        assert "Traceback" not in text
        honest.close()
    finally:
        c.stop()


@pytest.mark.timeout(60)
def test_waits_of_zero_ns_leave_the_links_watch_and_the_diagnosis_running(tmp_path):
    """Two nodes report a collective's waits as 0 ns eight times, then 50 ms: the links'
    watch took 0 ms for the link's best time and divided by it, and the diagnosis thread
    ended (no finding after it). A best of 0 ms is no link's speed: no ratio is made."""
    c, _ = _collector(tmp_path)
    try:
        group = {"z": ["d", [3, 4]]}
        nodes = {"zero-a": (3, connect_node(c.address, "zero-a")),
                 "zero-b": (4, connect_node(c.address, "zero-b"))}
        for seq in range(17):
            low = 0 if seq < 8 else 50_000_000
            for host, (rank, sock) in nodes.items():
                assert send(sock, _digest(host, [_position(rank)], groups=group,
                                          waits=[["z", seq, 1, low, rank, None,
                                                  ["all_reduce", 4]]]))
        honest = _mismatch_between_honest_nodes(c)
        until(lambda: "mismatch" in _kinds(tmp_path / "copy"), 20,
              f"the honest nodes' mismatch: {c.text()[-1500:]}")
        text = c.text()
        assert "the collector's diagnosis" not in text and "Traceback" not in text, text
        for _, sock in nodes.values():
            sock.close()
        for sock in honest:
            sock.close()
    finally:
        c.stop()


@pytest.mark.timeout(60)
def test_the_diagnosis_thread_survives_a_pass_that_fails(tmp_path):
    """findings.json cannot be written (a directory stands at its name, as a full disk
    or a removed copy would fail the write): the pass that fails is said once, and the
    thread goes on, so the mismatch is written once the path is free again (before, the
    thread ended at the first failure: no finding for the rest of the collection)."""
    c, _ = _collector(tmp_path)
    blocker = tmp_path / "copy" / "findings.json"
    try:
        blocker.mkdir()
        (blocker / "keep").write_text("x")
        honest = _mismatch_between_honest_nodes(c)
        c.wait_for("the collector's diagnosis", 20)
        shutil.rmtree(blocker)
        until(lambda: "mismatch" in _kinds(tmp_path / "copy"), 20,
              f"the mismatch written: {c.text()[-1500:]}")
        lines = [x for x in c.text().splitlines() if "the collector's diagnosis" in x]
        assert len(lines) == 1 and "goes on" in lines[0], lines
        for sock in honest:
            sock.close()
    finally:
        c.stop()


def _strict_json(text: str):
    """JSON as RFC 8259 has it: Infinity and NaN are no JSON (most readers refuse them)."""
    def refuse(name):
        raise ValueError(f"{name} in findings.json")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.timeout(60)
def test_a_findings_unbounded_numbers_are_kept_as_null(tmp_path):
    """A node's straggler finding whose details hold Infinity, 1e999 and -10^400: written
    into findings.json as they came (bare Infinity: no JSON a strict reader takes, a
    400-digit int no float holds). They are kept as null; the finding and its other
    details are kept."""
    c, _ = _collector(tmp_path)
    try:
        node = connect_node(c.address, "odd")
        details = ('{"source":"log","t":Infinity,"n":1e999,"big":-' + HUGE
                   + ',"ms":12.5,"deep":[NaN,1]}')
        finding = ('{"kind":"straggler","severity":"warning","summary":"late rank",'
                   '"ranks":[0],"details":' + details + '}')
        assert send(node, wire.frame(wire.FINDINGS, ('{"findings":[' + finding + ']}').encode()))
        path = tmp_path / "copy" / "findings.json"
        until(lambda: path.exists() and "late rank" in path.read_text(), 20, "the finding")
        found = _strict_json(path.read_text())["findings"]
        assert [f["details"] for f in found if f["summary"] == "late rank"] == [
            {"source": "log", "t": None, "n": None, "big": None, "ms": 12.5,
             "deep": [None, 1]}], found
        node.close()
    finally:
        c.stop()


@pytest.mark.timeout(60)
def test_a_probe_sample_of_a_gpu_at_10_400_degrees_is_refused(tmp_path):
    """A node's probe sample (SAMPLES: kept as the node wrote it, read back by the
    collector's viewer) with a GPU temperature of 10^400: /metrics exported it as
    dcgm-exporter does, and float() of it made every scrape a 500 while it was the
    node's newest. The frame is refused; /metrics answers; the node is dropped once."""
    c, metrics_port = _collector(tmp_path)
    try:
        node = connect_node(c.address, "gpuhost")
        sample = ('{"t": TIME, "host": "gpuhost", "nvml": "live", "gpus": [{"t": 1.0, '
                  '"source": "live", "index": 0, "temperature_c": DEGREES}], '
                  '"gpu_of_rank": {}}\n').replace("TIME", str(time.time()))
        assert send(node, wire.frame(wire.SAMPLES, sample.replace("DEGREES", HUGE).encode()))
        healthy = connect_node(c.address, "healthy")  # and a sound sample is exported
        assert send(healthy, wire.frame(wire.SAMPLES, sample.replace("DEGREES", "71").replace(
            "gpuhost", "healthy").encode()))
        until(lambda: 'Hostname="healthy"' in _metrics_text(metrics_port), 20,
              f"the healthy node's GPU in /metrics: {c.text()[-1500:]}")
        assert dropped(node, 10)
        lines = [x for x in c.text().splitlines() if "dropped node gpuhost" in x]
        assert len(lines) == 1 and "SAMPLES frame has a number" in lines[0], c.text()
        healthy.close()
    finally:
        c.stop()
