"""The README's picture of `distdoctor watch`, made by Textual itself from a recorded run.

  python docs/make_screenshot.py            # redraw docs/images/watch-mismatch.svg
  python docs/make_screenshot.py --record   # run the failing job again, then redraw

The run is a real failure: `distdoctor demo --nproc 4 --steps 6 --inject
mismatch:rank=3,step=3` (the reference trainer on 4 gloo ranks; rank 3 broadcasts where
the others all-reduce, the job hangs, distdoctor stops it). `--record` runs it with a
1 MiB event ring per rank and packs the run dir into docs/images/watch-mismatch.run.tar.gz
(its logs are sparse files: ~40 KB packed, ~20 MB unpacked). Without `--record` the
picture is drawn from that archive, so the same archive always gives the same picture;
tests/test_docs.py redraws it and compares the text on screen with the SVG's.

Two things on the screen would change from one drawing to the next, and are pinned: the
run dir's path (the archive is unpacked into a temporary directory; shown under the name
it was recorded with) and the header's "up" time, which counts to now for a finished job
(shown as the job's own length: its start to its last probe sample).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import replace
from pathlib import Path

DOCS = Path(__file__).resolve().parent
IMAGE = DOCS / "images" / "watch-mismatch.svg"
ARCHIVE = DOCS / "images" / "watch-mismatch.run.tar.gz"
SIZE = (160, 44)  # columns, lines
DEMO = ["demo", "--nproc", "4", "--steps", "6", "--inject", "mismatch:rank=3,step=3",
        "--no-dashboard"]


def record(archive: Path = ARCHIVE) -> str:
    """Run the failing demo job (no terminal: findings are printed); pack its run dir
    into `archive`. Returns what it printed: the README shows it."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "DISTDOCTOR_RING_MIB": "1"}
        proc = subprocess.run([sys.executable, "-m", "distdoctor", *DEMO], cwd=tmp, env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=600)
        runs = sorted((Path(tmp) / "distdoctor-runs").iterdir())
        if proc.returncode != 1 or len(runs) != 1:  # 1: distdoctor found an error
            raise SystemExit(f"the demo did not fail as expected (exit {proc.returncode}):\n"
                             f"{proc.stdout[-2000:]}")
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(runs[0], arcname=f"distdoctor-runs/{runs[0].name}")
    return proc.stdout  # and its stderr, in the order they came


def unpack(archive: Path, into: Path) -> Path:
    """The recorded run dir, unpacked under `into`."""
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    (run_dir,) = (into / "distdoctor-runs").iterdir()
    return run_dir


def job_length_s(run_dir: Path) -> float | None:
    """From the job's start (run.json) to the node sampler's last reading."""
    from datetime import datetime

    created = json.loads((run_dir / "run.json").read_text()).get("created")
    try:
        started = datetime.strptime(created, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except (TypeError, ValueError):
        started = None
    last = None
    for path in sorted((run_dir / "probes").glob("node-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                last = max(last or 0.0, float(json.loads(line)["t"]))
            except (ValueError, KeyError, TypeError):
                continue
    return None if started is None or last is None else max(0.0, last - started)


def draw(run_dir: Path, shown_as: str) -> str:
    """The dashboard of `run_dir` as Textual exports it (SVG), the run dir named `shown_as`."""
    from distdoctor.tui.app import WatchApp

    from distdoctor.diagnosis.live import LiveDiagnosis
    from distdoctor.diagnosis.postmortem import read_exits
    from distdoctor.runlog.rundir import open_run_dir
    from distdoctor.views.snapshot import SnapshotTaker

    info = open_run_dir(str(run_dir))
    exits = {r: (e.code, e.how == "stopped") for r, e in read_exits(run_dir)[0].items()}
    # as `distdoctor watch` builds its viewer; one pass reads the finished run whole
    live = LiveDiagnosis(run_dir, info.hang_timeout_s, stacks="none", owner=False,
                         exits=lambda: exits)
    live.pass_once()
    length = job_length_s(run_dir)

    class Pinned(WatchApp):
        def show(self, snap):
            self.sub_title = shown_as  # (Textual runs every class's on_mount: not there)
            super().show(replace(snap, run_dir=shown_as, elapsed_s=length))

    taker = SnapshotTaker(live)
    # the first snapshot has no rates yet ("-"), later ones do (0 for a finished job); the
    # app takes one or two (a row highlighted on mount may ask for another): take the
    # first here, so that whichever the picture shows says the same
    taker.take()
    app = Pinned(taker, refresh_s=3600)  # no refresh: nothing moves

    async def shoot() -> str:
        async with app.run_test(size=SIZE) as pilot:
            for _ in range(600):  # the first snapshot is taken on a worker thread
                await pilot.pause(0.05)
                if app.snapshot is not None:
                    break
            else:
                raise RuntimeError("the dashboard showed no snapshot in 30 s")
            await pilot.press("f")  # the findings: the detail pane shows the first one
            await pilot.pause(0.2)
            return app.export_screenshot(title="distdoctor watch")

    try:
        return asyncio.run(shoot())
    finally:
        live.close()


def draw_archive(archive: Path = ARCHIVE) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = unpack(archive, Path(tmp))
        return draw(run_dir, f"distdoctor-runs/{run_dir.name}")


def screen_text(svg: str) -> list[str]:
    """The characters on screen, line by line, from an SVG Textual exported: what a
    drawing says, whatever the styling of the Textual that drew it."""
    import html

    lines: dict[int, list[tuple[float, str]]] = {}
    for m in re.finditer(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>',
                         svg):
        x, y, text = float(m.group(1)), float(m.group(2)), html.unescape(m.group(3))
        lines.setdefault(round(y), []).append((x, text.replace("\xa0", " ")))
    return ["".join(t for _, t in sorted(parts)).rstrip() for _, parts in sorted(lines.items())]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true",
                        help="run the failing job again and record its run dir first")
    args = parser.parse_args()
    if args.record:
        print(record())
    if not ARCHIVE.exists():
        raise SystemExit(f"{ARCHIVE} is missing: run with --record")
    IMAGE.parent.mkdir(parents=True, exist_ok=True)
    IMAGE.write_text(draw_archive())
    print(f"wrote {IMAGE.relative_to(DOCS.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
