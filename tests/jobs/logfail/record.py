"""Rerun the failing jobs of this folder and rewrite tests/fixtures/logs/real/.

    python tests/jobs/logfail/record.py            # every scenario (about 3 minutes here)
    python tests/jobs/logfail/record.py sigkill_rank2 healthy   # some of them

Each scenario is a real torchrun (or python) run on gloo/CPU; its combined stdout+stderr,
as a terminal shows it (2>&1), becomes `<name>.log`. Scenarios run with `--redirects` also
keep each rank's own files. The ground truth a correct diagnosis must give (expected.json)
and the fixture list (README.md) are written from the table in scenarios.py, so the three
never disagree. Every run has a hard time limit, its output is capped, and its whole
session is killed afterwards, so nothing is left running.
"""

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from scenario_spec import Scenario  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402
from scenarios_wide import SCENARIOS_WIDE  # noqa: E402

SCENARIOS = SCENARIOS + SCENARIOS_WIDE

REPO = Path(__file__).resolve().parents[3]
OUT = REPO / "tests" / "fixtures" / "logs" / "real"
MAX_BYTES = 40_000  # a fixture larger than this is a scenario to shorten, not to trim
CAP_BYTES = 1_000_000  # never read more than this from a run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(sc: Scenario) -> tuple[dict[str, bytes], int]:
    """Run the scenario's command once; return its files (name -> content) and the port."""
    port = free_port()
    holder = None
    if sc.hold_port:  # another process already listens on MASTER_PORT
        holder = socket.socket()
        holder.bind(("0.0.0.0", port))
        holder.listen(1)
    # a private TMPDIR: torchrun leaves its torchelastic_* error-file folders behind
    root = Path(tempfile.mkdtemp(prefix="logfail-"))
    log_dir, tmp_dir = root / "logs", root / "tmp"
    tmp_dir.mkdir()
    cmd = shlex.split(sc.cmd.format(port=port, log_dir=log_dir))
    cmd = [sys.executable if a == "python" else a for a in cmd]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_", "NCCL_"))}
    env.update({k: v.format(port=port) for k, v in sc.env.items()})
    env["TMPDIR"] = str(tmp_dir)
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    chunks, size = [], 0
    try:
        deadline = started + sc.timeout
        os.set_blocking(proc.stdout.fileno(), False)
        while True:
            data = proc.stdout.read(65536)
            if data:
                if size < CAP_BYTES:
                    chunks.append(data[: CAP_BYTES - size])
                size += len(data)
            elif proc.poll() is not None:
                break
            elif time.monotonic() > deadline:
                print(f"  {sc.name}: hit its {sc.timeout} s limit", file=sys.stderr)
                break
            else:
                time.sleep(0.05)
    finally:
        try:  # the whole session: torchrun, its ranks, anything they started
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        if holder:
            holder.close()
    files = {f"{sc.name}.log": b"".join(chunks)}
    # --redirects: each rank's own files
    for rank_file in sorted(log_dir.rglob("*.log")) if log_dir.exists() else []:
        if rank_file.stat().st_size:
            local_rank, stream = rank_file.parent.name, rank_file.stem
            files[f"{sc.name}.rank{local_rank}.{stream}.log"] = rank_file.read_bytes()[:CAP_BYTES]
    shutil.rmtree(root, ignore_errors=True)
    elapsed = time.monotonic() - started
    print(f"{sc.name}: exit {proc.returncode}, {elapsed:.1f} s, {size} bytes", file=sys.stderr)
    return files, port


def missing(sc: Scenario, files: dict[str, bytes]) -> list[str]:
    """What the run lacks (or shows and should not) to be the scenario it is meant to be."""
    text = b"".join(files.values()).decode(errors="replace")
    return [f"no {m!r}" for m in sc.must if m not in text] + [
        f"has {m!r}" for m in sc.must_not if m in text
    ]


def run_scenario(sc: Scenario) -> tuple[list[str], int]:
    """Run one scenario (again, while a race went the other way); write its fixture files;
    return their names and the port used."""
    for attempt in range(1, sc.tries + 1):
        files, port = run_once(sc)
        wrong = missing(sc, files)
        if not wrong:
            break
        print(f"  {sc.name}: try {attempt}/{sc.tries}: {', '.join(wrong)}", file=sys.stderr)
    else:
        print(f"  {sc.name}: KEPT A RUN THAT IS NOT WHAT THE SCENARIO SAYS", file=sys.stderr)
    for old in OUT.glob(f"{sc.name}.*log"):
        old.unlink()
    for name, content in files.items():
        (OUT / name).write_bytes(content)
        if len(content) > MAX_BYTES:
            print(
                f"  {name}: {len(content)} bytes, over {MAX_BYTES}: shorten the job",
                file=sys.stderr,
            )
    return list(files), port


def uses_port(sc: Scenario) -> bool:
    return "{port}" in json.dumps(sc.expect)


def write_manifest(runs: dict[str, tuple[list[str], int]]) -> None:
    """expected.json and README.md for every scenario with a fixture; a scenario not rerun
    keeps the port its fixture was recorded with (some expectations name the port)."""
    manifest = OUT / "expected.json"
    old = json.loads(manifest.read_text()) if manifest.exists() else []
    old_ports = {str(e["log"]): e.get("port") for e in old}
    expected, readme = [], [README_HEAD.format(torch=torch.__version__)]
    for sc in SCENARIOS:
        names, port = runs.get(sc.name, (None, None))
        names = names or sorted(p.name for p in OUT.glob(f"{sc.name}.*log"))
        if not names:
            continue
        names = sorted(names, key=lambda n: (n != f"{sc.name}.log", n))
        log = names[0] if len(names) == 1 else names
        entry = {"log": log, "what": sc.what}
        expect = json.dumps(sc.expect)
        if uses_port(sc):
            port = port or old_ports.get(str(log))
            expect = expect.replace("{port}", str(port))
            entry["port"] = port
        entry.update(json.loads(expect))
        expected.append(entry)
        shown = " ".join([*sc.env_shown(), sc.cmd.format(port="PORT", log_dir="LOGDIR")])
        readme.append(f"- `{'`, `'.join(names)}`: {sc.what}\n  `{shown}`\n")
        if sc.note:
            readme.append(f"  {sc.note}\n")
    manifest.write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")
    (OUT / "README.md").write_text("".join(readme))


README_HEAD = """# Real failure logs (recorded, not written)

Each `.log` here is what torch {torch} (CPU build, gloo, Python 3.11) printed on a 2-core
machine with no GPU, stdout and stderr combined as a terminal shows them. Nothing was
edited. `tests/jobs/logfail/record.py` reruns the jobs (`worker.py` and the small scripts
beside it) and rewrites these files, `expected.json` and this list, all from the table in
`tests/jobs/logfail/scenarios.py`. PORT is a free port chosen per run (expected.json keeps
it where a finding must name it); LOGDIR a temporary directory. Outcomes that are races
are rerun until the log shows what the scenario is about (scenarios.py: must, must_not).

`expected.json`, one object per fixture: the ground truth a correct diagnosis must give.
`log` (a file or a list of files read together), `what` (what really happened), `kind`
(crash, comm_error, mismatch or hang: the top finding's kind; null for a healthy log),
`family` (launcher, oom, store, nccl, gloo, mismatch, ddp, exception, serial_work, startup,
healthy), `ranks` (the culprit ranks the top finding must name; [] when the log cannot
tell; null: not checked), `words` (what the top finding's summary must contain, any case),
`remedy_words` (optional: what its remedy must contain), `quiet` (true: no error or warning
finding at all).

"""


def main(argv: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    wanted = [sc for sc in SCENARIOS if not argv or sc.name in argv]
    runs = {sc.name: run_scenario(sc) for sc in wanted}
    write_manifest(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
