"""Record real NVML readings into a replay fixture (the format of probes/nvml_replay.py).

    python -m distdoctor.probes.record_nvml --out tests/fixtures/nvml/h100_matmul_rec.json \
        --seconds 20 [--interval 1.0] [--note "bf16 matmul loop on every GPU"]

Run it on a GPU machine while the GPUs do what the fixture should show (idle, a heavy matmul
loop, a throttling GPU). The probe runs exactly as it does live; every NVML answer it gets is
written down, so `NvmlProbe(ReplayNvml(FILE))` later reads the same values.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

from distdoctor.probes.nvml import NvmlProbe, load_pynvml
from distdoctor.probes.nvml_replay import RecordingNvml


def record(out: Path, seconds: float, interval: float, note: str) -> int:
    nvml = load_pynvml()
    if nvml is None:
        print("record_nvml: nvidia-ml-py is not installed", file=sys.stderr)
        return 2
    rec = RecordingNvml(nvml)
    probe = NvmlProbe(rec, source="live")
    if not probe.devices():
        print(f"record_nvml: {probe.unavailable_reason or 'no GPUs found'}", file=sys.stderr)
        return 2
    driver = probe.call("nvmlSystemGetDriverVersion")
    t0 = time.monotonic()
    n = 0
    while True:
        now = time.monotonic() - t0
        if now > seconds and n:
            break
        rec.new_frame(now)
        for s in probe.snapshot():
            if n == 0 or s.reasons:
                print(f"t={now:5.1f}s GPU {s.index}: {s.temperature_c} C, SM {s.sm_clock_mhz}/"
                      f"{s.max_sm_clock_mhz} MHz, {s.utilization_pct}% busy, reasons "
                      f"{', '.join(s.reasons) or 'none'}")
        n += 1
        time.sleep(max(0.0, interval - (time.monotonic() - t0 - now)))
    probe.close()
    meta = {"host": socket.gethostname(), "driver": driver if isinstance(driver, str) else
            str(driver), "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seconds": seconds, "interval_s": interval,
            "gpu": rec.devices[0].get("name") if rec.devices else None}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rec.fixture(note=note or "recorded", meta=meta), indent=1) + "\n")
    print(f"record_nvml: {n} frames of {len(rec.devices)} GPU(s) -> {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m distdoctor.probes.record_nvml",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="fixture file to write")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long to record")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between readings")
    ap.add_argument("--note", default="", help="what the GPUs were doing")
    args = ap.parse_args(argv)
    return record(args.out, args.seconds, args.interval, args.note)


if __name__ == "__main__":
    sys.exit(main())
