"""`/metrics` under a flood of idle connections and a slow sender, for real, on loopback.

Hundreds of connections that never send a request must not take the descriptors of the
process that serves them (`distdoctor run`: its probe sampler, the ranks' logs), nor keep
a real scrape out; a request trickled a byte at a time is dropped within a few seconds.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import Lines, _kill_ranks, stop_process

from distdoctor.diagnosis.live import LiveDiagnosis
from distdoctor.export.metrics_http import REQUEST_S, MetricsServer, scraper_cap
from distdoctor.launch.env import free_port

IDLE = 400  # well past `run`'s 256 descriptors below
JOB = "import time\nfor _ in range(1200):\n    time.sleep(0.05)\n"


def _scrape(url: str, timeout: float = 10) -> tuple[int, str, float]:
    t = time.monotonic()
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, resp.read().decode(), time.monotonic() - t


@contextlib.contextmanager
def idle_connections(port: int, n: int):
    """Up to `n` connections that send nothing, held open (fewer where the server stops
    accepting: three connects in a row that time out end the flood)."""
    socks, in_a_row = [], 0
    try:
        while len(socks) < n and in_a_row < 3:
            s = socket.socket()
            s.settimeout(3)  # the server's thread runs at low priority on a busy machine
            try:
                s.connect(("127.0.0.1", port))
            except OSError:
                s.close()
                in_a_row += 1
                continue
            in_a_row = 0
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def _samples(run_dir: Path) -> int:
    """Probe samples `run` has written so far (the header line left out)."""
    n = 0
    for path in (run_dir / "probes").glob("node-*.jsonl"):
        with contextlib.suppress(OSError):
            n += max(0, path.read_text().count("\n") - 1)
    return n


def _low_files_limit() -> None:  # in the child, before exec: `ulimit -n 256`
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def _until(what: str, fn, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what}")


@pytest.mark.timeout(120)
def test_run_serves_a_scrape_and_keeps_sampling_beside_hundreds_of_idle_connections(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    run_dir, port = tmp_path / "run", free_port()
    run = subprocess.Popen(
        [sys.executable, "-m", "distdoctor", "run", "--nproc", "1", "--run-dir", str(run_dir),
         "--metrics", f"127.0.0.1:{port}", "--", str(job)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        start_new_session=True, preexec_fn=_low_files_limit,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    lines = Lines(run)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        lines.wait_for("metrics at http://127.0.0.1", 30)
        _until("the first probe samples", lambda: _samples(run_dir) >= 2, 30)
        with idle_connections(port, IDLE) as held:
            status, body, took = _scrape(url)
            assert status == 200 and "distdoctor_" in body
            assert took < 5, f"a scrape took {took:.1f} s beside {len(held)} idle sockets"
            before = _samples(run_dir)
            _until("new probe samples during the flood", lambda: _samples(run_dir) >= before + 2,
                   15)
            assert run.poll() is None, "".join(lines.lines)
    finally:
        stop_process(run)
        _kill_ranks(run_dir)
    err = "".join(lines.lines)
    assert "Too many open files" not in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]


@pytest.fixture
def server(tmp_path):
    live = LiveDiagnosis(tmp_path, owner=False, backlog=0)
    srv = MetricsServer(("127.0.0.1", 0), None).serve(live, "j1")
    try:
        yield srv
    finally:
        srv.stop()
        live.close()


@pytest.mark.timeout(60)
def test_idle_connections_are_capped_and_a_scrape_still_gets_in(server):
    port = server.address[1]
    before = len(os.listdir("/proc/self/fd"))
    with idle_connections(port, 300) as held:
        assert len(held) == 300
        time.sleep(1)  # the server accepts what waits in its backlog
        # this process holds both ends: the server's side is what is left over
        server_side = len(os.listdir("/proc/self/fd")) - before - len(held)
        assert server_side <= scraper_cap() + 2, server_side
        status, body, took = _scrape(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and 'distdoctor_events_ingested_total{job="j1"}' in body
        assert took < 5


@pytest.mark.timeout(60)
def test_a_request_trickled_byte_by_byte_is_dropped(server):
    s = socket.create_connection(("127.0.0.1", server.address[1]), timeout=2)
    s.sendall(b"GET /metrics HTTP/1.1\r\n")
    start = time.monotonic()
    closed_after = None
    try:
        while time.monotonic() - start < REQUEST_S + 10:
            try:
                s.sendall(b"X")  # one byte of a header every half second
                time.sleep(0.5)
                s.settimeout(0.01)
                if s.recv(1024) == b"":
                    closed_after = time.monotonic() - start
                    break
            except TimeoutError:
                continue
            except OSError:
                closed_after = time.monotonic() - start
                break
    finally:
        s.close()
    assert closed_after is not None, "a slow sender kept its connection"
    assert closed_after < REQUEST_S + 2.5, closed_after
    # and the server still answers
    assert _scrape(f"http://127.0.0.1:{server.address[1]}/metrics")[0] == 200


def test_the_cap_stays_well_below_a_low_files_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        assert 4 <= scraper_cap() <= 256 // 8
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
