"""distdoctor's /metrics, read by a real Prometheus server (Debian's `prometheus` package,
installed by .ci/run), and its alert rules checked and unit-tested with `promtool`.

Without the binaries these tests skip here, and fail where DISTDOCTOR_REQUIRE_PROMETHEUS=1
(CI), so a missing install step cannot pass as green.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import JOBS, Lines, _kill_ranks, run_cli, start_cli, stop_process
from test_probes_sampler_throttle import replayed_run

from distdoctor.diagnosis.live import LiveDiagnosis
from distdoctor.export.metrics import DCGM_FIELDS, METRICS, gather, render
from distdoctor.export.metrics_http import MetricsServer
from distdoctor.launch.env import free_port

DOCS = Path(__file__).resolve().parents[1] / "docs"
RULES = DOCS / "prometheus" / "distdoctor.rules.yml"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("DISTDOCTOR_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(f"{name} is not installed (.ci/run installs Debian's prometheus)")
        pytest.skip(f"{name} is not installed (apt-get install prometheus)")
    return path


def _get(url: str, token: str | None = None, timeout: float = 5) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# --- the rules, the scrape config and the dashboard ---------------------------------------
def test_alert_rules_pass_promtool_check_and_their_unit_tests():
    promtool = _tool("promtool")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "7 rules found" in check.stdout
    unit = subprocess.run([promtool, "test", "rules", "distdoctor.rules.test.yml"],
                          cwd=RULES.parent, capture_output=True, text=True, timeout=60)
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_the_documented_scrape_config_is_valid(tmp_path):
    promtool = _tool("promtool")
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    config = (DOCS / "prometheus" / "prometheus.yml").read_text().replace(
        "/etc/prometheus/distdoctor.token", str(token))
    (tmp_path / "prometheus.yml").write_text(config)
    shutil.copy(RULES, tmp_path)
    out = subprocess.run([promtool, "check", "config", "prometheus.yml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def dashboard_queries(job: str) -> list[str]:
    board = json.loads((DOCS / "grafana" / "distdoctor-dashboard.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    assert len(exprs) == len(board["panels"]) >= 10
    return [e.replace("$job", job) for e in exprs]


# --- a real job, a real server --------------------------------------------------------------
class Prometheus:
    """A Prometheus server on loopback scraping `target` every second, with our rules."""

    def __init__(self, tmp: Path, target: str, config: str | None = None):
        """`config`: a whole config file (else a plain scrape of `target`)."""
        binary = _tool("prometheus")
        self.port = free_port()
        (tmp / "prometheus.yml").write_text(config or (
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{json.dumps(str(RULES))}]\n"
            "scrape_configs:\n"
            "  - job_name: distdoctor\n"
            "    honor_labels: true\n"
            f"    static_configs: [{{targets: [{json.dumps(target)}]}}]\n"))
        self.log = open(tmp / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self.base = f"http://127.0.0.1:{self.port}"

    def api(self, path: str, **params) -> dict:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        status, body = _get(f"{self.base}/api/v1/{path}{query}")
        data = json.loads(body)
        assert status == 200 and data["status"] == "success", (path, params, body)
        return data["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def stop(self) -> None:
        stop_process(self.proc, timeout_s=15)
        self.log.close()


def _until(what: str, fn, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = fn()
        except (OSError, ValueError, AssertionError):
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout_s} s: {what}")


@pytest.mark.timeout(150)
def test_prometheus_shows_the_hung_rank_and_fires_the_hang_alert(tmp_path):
    """4 gloo ranks; rank 3 spins in its data loader while 0-2 wait in an all_reduce.
    Prometheus scrapes `run --metrics` each second: its query API shows ranks 0-2 hung
    and rank 3 the culprit, and DistdoctorHang fires naming rank 3."""
    metrics_port = free_port()
    run_dir = tmp_path / "run"
    run = start_cli(["run", "--nproc", "4", "--run-dir", str(run_dir), "--hang-timeout", "3",
                     "--grace", "1", "--metrics", f"127.0.0.1:{metrics_port}", "--",
                     str(JOBS / "bugs" / "stuck_outside.py")])
    lines = Lines(run)
    prom = None
    try:
        lines.wait_for("metrics at http://127.0.0.1", 30)
        prom = Prometheus(tmp_path, f"127.0.0.1:{metrics_port}")
        _until("Prometheus ready", lambda: _get(f"{prom.base}/-/ready")[0] == 200, 30)

        culprits = _until("the hang's culprit in Prometheus", lambda: prom.query(
            'distdoctor_culprit{kind="hang"} == 1'), 60)
        assert [c["metric"]["rank"] for c in culprits] == ["3"]
        job = culprits[0]["metric"]["job"]
        assert job == "run"  # the run dir's name, kept by honor_labels
        hung = _until("ranks 0-2 hung", lambda: (
            r := prom.query('distdoctor_rank_state{state="hung"} == 1')) and len(r) == 3 and r,
            30)
        assert sorted(h["metric"]["rank"] for h in hung) == ["0", "1", "2"]
        assert {h["metric"]["host"] for h in hung} == {os.uname().nodename}
        waited = prom.query('distdoctor_rank_in_collective_seconds{rank="0"}')
        assert float(waited[0]["value"][1]) >= 3.0
        late = prom.query('distdoctor_rank_state{rank="3",state="running"}')
        assert late and late[0]["value"][1] == "1"

        alert = _until("DistdoctorHang firing", lambda: [
            a for a in prom.api("alerts")["alerts"]
            if a["labels"]["alertname"] == "DistdoctorHang" and a["state"] == "firing"], 30)
        assert alert[0]["labels"]["rank"] == "3" and alert[0]["labels"]["job"] == job
        assert "waiting for rank 3" in alert[0]["annotations"]["summary"]

        # every dashboard panel's query is valid PromQL and most have data here (a rate
        # needs two scrapes of a series inside its window: a few seconds after the first)
        def answered() -> list[bool]:
            return [bool(prom.query(expr)) for expr in dashboard_queries(job)]

        try:
            _until("dashboard queries answered", lambda: sum(answered()) >= 6, 15)
        except AssertionError:
            raise AssertionError(list(zip(answered(), dashboard_queries(job),
                                          strict=True))) from None
    finally:
        if prom is not None:
            prom.stop()
        stop_process(run)
        _kill_ranks(run_dir)


# --- the endpoint itself ------------------------------------------------------------------
def test_metrics_name_replayed_gpus_by_rank_under_dcgm_names(tmp_path):
    """GPU readings (replayed NVML: constructed fixtures, see test_probes_sampler_throttle)
    go out under dcgm-exporter's names with the rank that uses each GPU, marked replayed."""
    replayed_run(tmp_path, "h100_hw_thermal")
    live = LiveDiagnosis(tmp_path, owner=False, backlog=0)
    try:
        live.pass_once()
        families = {f.name: f for f in gather(live, "j1")}
    finally:
        live.close()
    assert [name for name, _, _ in METRICS] == list(families)[:len(METRICS)]
    clocks = families["DCGM_FI_DEV_SM_CLOCK"].samples
    by_rank = {labels["rank"]: (labels, value) for labels, value in clocks}
    assert sorted(by_rank, key=int) == [str(r) for r in range(8)]
    labels, value = by_rank["6"]
    assert value == 1155  # the hot GPU of the fixture (1155 of 1980 MHz)
    assert labels["source"] == "replay" and labels["job"] == "j1"
    assert labels["gpu"] == "6" and labels["UUID"].startswith("GPU-") and labels["Hostname"]
    temp = {lab["rank"]: v for lab, v in families["DCGM_FI_DEV_GPU_TEMP"].samples}
    assert temp["6"] == 89
    text = render(list(families.values())).decode()
    assert 'DCGM_FI_DEV_GPU_TEMP{' in text and 'rank="6"' in text
    assert {name for name, *_ in DCGM_FIELDS} <= set(families)


def test_a_token_is_required_when_one_is_set(tmp_path):
    live = LiveDiagnosis(tmp_path, owner=False, backlog=0)
    server = MetricsServer(("127.0.0.1", 0), "s3cret").serve(live, "j1")
    base = f"http://127.0.0.1:{server.address[1]}"
    try:
        assert _get(f"{base}/metrics")[0] == 401
        assert _get(f"{base}/metrics", token="wrong")[0] == 401
        status, body = _get(f"{base}/metrics", token="s3cret")
        assert status == 200 and 'distdoctor_events_ingested_total{job="j1"}' in body
        assert _get(f"{base}/other", token="s3cret")[0] == 404
    finally:
        server.stop()
        live.close()


def test_bad_metrics_addresses_get_one_line_and_leave_nothing(tmp_path):
    job = ["--", "python", "-c", "pass"]
    out = run_cli(["run", "--run-dir", str(tmp_path / "a"), "--metrics", "nowhere", *job])
    assert out.returncode == 2 and "expected HOST:PORT" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "a").exists()
    env = {"DISTDOCTOR_TOKEN": ""}
    out = run_cli(["run", "--run-dir", str(tmp_path / "b"), "--metrics", "0.0.0.0:9",
                   *job], env=env)
    assert out.returncode == 2 and "needs a shared token" in out.stderr
    with MetricsServer(("127.0.0.1", 0), None).httpd as taken:  # a port in use
        port = taken.server_address[1]
        out = run_cli(["run", "--run-dir", str(tmp_path / "c"), "--metrics",
                       f"127.0.0.1:{port}", *job])
    assert out.returncode != 0 and "cannot listen on 127.0.0.1" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "c").exists()
    out = run_cli(["watch", str(tmp_path), "--metrics", "127.0.0.1:0"])
    assert out.returncode == 2 and "use it with --listen" in out.stderr


# --- over https, with a client certificate -------------------------------------------------
@pytest.mark.timeout(90)
def test_prometheus_scrapes_metrics_over_https_with_its_client_certificate(tmp_path,
                                                                           tls_certs):
    """The documented TLS scrape config (docs/prometheus/prometheus-tls.yml), its paths
    pointed at certificates made for this test, scrapes /metrics over https with a client
    certificate; plain http and https without a client certificate get nothing."""
    import ssl

    from distdoctor.collect.tls import TLSSettings

    c = tls_certs
    ctx = TLSSettings(str(c.server), str(c.server_key), str(c.ca)).server_context("test")
    live = LiveDiagnosis(tmp_path, owner=False, backlog=0)
    server = MetricsServer(("127.0.0.1", 0), "s3cret", ctx).serve(live, "tls-job")
    target = f"127.0.0.1:{server.address[1]}"
    assert server.url == f"https://{target}/metrics"
    (tmp_path / "token").write_text("s3cret\n")
    config = (DOCS / "prometheus" / "prometheus-tls.yml").read_text()
    for doc, ours in (("/etc/prometheus/distdoctor-ca.pem", c.ca),
                      ("/etc/prometheus/prometheus-client.pem", c.client),
                      ("/etc/prometheus/prometheus-client.key", c.client_key),
                      ("/etc/prometheus/distdoctor.token", tmp_path / "token"),
                      ('"node001:9464", "node002:9464"', json.dumps(target)),
                      ("distdoctor.rules.yml", str(RULES)), ("15s", "1s")):
        assert doc in config, doc
        config = config.replace(doc, str(ours))
    prom = None
    try:
        with pytest.raises((OSError, urllib.error.URLError)):  # http: no answer at all
            _get(f"http://{target}/metrics", token="s3cret")
        no_cert = ssl.create_default_context(cafile=str(c.ca))
        with pytest.raises((OSError, urllib.error.URLError)):
            urllib.request.urlopen(server.url, timeout=5, context=no_cert).read()
        prom = Prometheus(tmp_path, target, config)
        _until("Prometheus ready", lambda: _get(f"{prom.base}/-/ready")[0] == 200, 30)
        up = _until("an https scrape", lambda: prom.query("up == 1"), 45)
        assert up and server.scrapes >= 1
        ingested = prom.query('distdoctor_events_ingested_total{job="tls-job"}')
        assert ingested, prom.api("targets")
    finally:
        if prom is not None:
            prom.stop()
        server.stop()
        live.close()
