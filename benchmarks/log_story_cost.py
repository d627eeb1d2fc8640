"""What reading a log as the job's story costs `diagnose --log` (issue 47): the tree before it
against the working tree, alternated in one run, on the same generated logs.

  (a) the big log of log_throughput.py (8,192 ranks' interleaved output, a watchdog timeout
      near the end): the fast path, where the story adds two windows per file after the
      line pass, and the line parser one cheap test for colour codes that lost their ESC;
  (b) a log whose lines start with a head no rule knows (vLLM-style worker heads, learned
      from the file: every line parsed on the slow path), where the parser's new test runs
      on every line.

CPU seconds of the child (user + sys from wait4), best of --repeats per tree: the machine
is shared, and noise only adds. Ratio = after / before (1.00: no cost).

  python benchmarks/log_story_cost.py [--size 150MB] [--head-size 30MB] [--repeats 2]
                                      [--before REV]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from log_throughput import parse_size, write_log  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def old_tree(rev: str, into: str) -> str:
    """The package as it was at `rev`, unpacked under `into` (for PYTHONPATH)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "distdoctor"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def write_head_log(path: str, size: int, seed: int = 0) -> None:
    """vLLM-style worker lines ("(VllmWorker rank=N pid=P) INFO 09-09 02:24:28 [file.py:L]
    text") with a failure near the end."""
    rnd = random.Random(seed)
    written = 0
    with open(path, "w") as fh:
        i = 0
        while written < size:
            r = rnd.randrange(8)
            line = (f"(VllmWorker rank={r} pid={1000 + r}) INFO 09-09 02:{i // 60 % 60:02d}:"
                    f"{i % 60:02d} [model_runner.py:{100 + r}] step {i} | loss "
                    f"{rnd.random():.4f} | tok/s {rnd.randrange(9000, 9900)}\n")
            fh.write(line)
            written += len(line)
            i += 1
        fh.write("(VllmWorker rank=3 pid=1003) ERROR 09-09 03:00:00 [worker.py:88] "
                 "RuntimeError: CUDA error: an illegal memory access was encountered\n")


def cpu_seconds(pythonpath: str, log: str) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    proc = subprocess.Popen([sys.executable, "-m", "distdoctor", "diagnose", "--log", log],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            cwd=tempfile.gettempdir())
    out = proc.stdout.read().decode("utf-8", "replace")
    _, _, usage = os.wait4(proc.pid, 0)
    proc.stdout.close()
    return usage.ru_utime + usage.ru_stime, out


def compare(name: str, log: str, trees: dict[str, str], repeats: int) -> None:
    best: dict[str, float] = {}
    first: dict[str, str] = {}
    for _ in range(repeats):
        for label, path in trees.items():  # alternated: the machine's load hits both
            secs, out = cpu_seconds(path, log)
            best[label] = min(best.get(label, secs), secs)
            first.setdefault(label, next((ln for ln in out.splitlines()
                                          if ln[:3].strip(". ").isdigit()), ""))
    mb = os.path.getsize(log) / 1e6
    before, after = best["before"], best["after"]
    print(f"{name}: {mb:.0f} MB; before {before:.2f} CPU-s ({mb / before:.1f} MB/CPU-s), "
          f"after {after:.2f} CPU-s ({mb / after:.1f} MB/CPU-s); ratio after/before "
          f"{after / before:.3f}")
    for label in trees:
        print(f"  {label}: {first[label][:150]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="150MB")
    ap.add_argument("--head-size", default="30MB")
    ap.add_argument("--ranks", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--before", default="5c9483b~1", help="the tree before issue 47")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dd-logstory-")
    try:
        trees = {"before": old_tree(args.before, os.path.join(tmp, "before")
                                    if os.makedirs(os.path.join(tmp, "before")) is None
                                    else ""),
                 "after": str(ROOT)}
        big = os.path.join(tmp, "big.log")
        write_log(big, parse_size(args.size), args.ranks)
        compare("(a) fast path", big, trees, args.repeats)
        os.remove(big)
        head = os.path.join(tmp, "head.log")
        write_head_log(head, parse_size(args.head_size))
        compare("(b) learned head, slow path", head, trees, args.repeats)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
