"""`diagnose --log` on a log that names a million ranks (issue 46, item 8: within 60 s and
1 GB; it took over 110 s and 1.2 GB), and on 1 MB lines built to make a regex backtrack.

The log: c10d's watchdog timeout on one collective, printed by every rank but one (the
culprit, which printed progress instead), the way torch 2.x prints it (`[rankN]:[E... ProcessGroupNCCL.cpp:...] [PG ID 0 PG GUID
0(default_pg) Rank N] Watchdog caught collective operation timeout: ...`); with
--nccl-info, NCCL_DEBUG=INFO's init line and a progress line from every rank before it (three
lines a rank, two of them read by the families). Written into a
temporary directory, deleted at the end. `python -m distdoctor diagnose --log LOG` then runs
in its own process under `/usr/bin/time -v` where there is one (wall time, peak RSS), else
timed here with the peak RSS from wait4.

The pathological lines (each about 1 MB, one line): each regex of logs/lines.py's opening
token repeated; each parsed in this process, best of --repeats.

  python benchmarks/log_scale.py [--ranks 1000000] [--nccl-info] [--repeats 1] [--dir /tmp]
                                 [--lines-only]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

GOAL_S, GOAL_MB = 60, 1000
LINE_GOAL_S = 1.0


def write_log(path: str, ranks: int, nccl_info: bool = False) -> int:
    """The log of `ranks` ranks described above; returns its size in bytes. `nccl_info`:
    with NCCL_DEBUG=INFO's init line and a progress line from every rank before."""
    culprit = 7 % ranks
    written = 0
    parts = (_init_line, _progress_line, _watchdog_line) if nccl_info else (_watchdog_line,)
    with open(path, "w", encoding="utf-8", buffering=1 << 20) as fh:
        for part in parts:
            block = []
            for r in range(ranks):
                if part is _watchdog_line and r == culprit:
                    block.append(_progress_line(r))
                else:
                    block.append(part(r))
                if len(block) == 65536:
                    written += fh.write("".join(block))
                    block = []
            written += fh.write("".join(block))
    return written


def _init_line(r: int) -> str:
    return (f"[rank{r}]:node{r // 8:06d}:{20000 + r % 8}:{20100 + r % 8} [{r % 8}] NCCL INFO "
            f"ncclCommInitRank comm 0x7f00 rank {r} nranks 1000000 - Init COMPLETE\n")


def _progress_line(r: int) -> str:
    return f"[rank{r}]:step 41 loss 2.{r % 97:02d} tokens/s 11834\n"


def _watchdog_line(r: int) -> str:
    return (f"[rank{r}]:[E1123 10:37:34.617383930 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID "
            f"0(default_pg) Rank {r}] Watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum=42, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, "
            f"Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n")


# one shape per regex of logs/lines.py (and the scans that replaced some): its opening
# token, or the run that made it backtrack, repeated to about 1 MB
def pathological_lines(size: int = 1 << 20) -> dict[str, str]:
    def rep(token: str, prefix: str = "", suffix: str = "") -> str:
        return prefix + token * max(1, (size - len(prefix) - len(suffix)) // len(token)) + suffix

    return {
        "c10d rank, unclosed PG heads": rep("[PG ID 0 PG GUID 0(default_pg) Rank "),
        "c10d rank, bare heads": rep("[Rank ", "x "),
        "c10d rank, '[' before one 'Rank N]'": rep("[", "x ", "Rank 3]"),
        "ray dedup note after blanks": rep(" ", "x", "across cluster]"),
        "glued glog head, dots": rep(".", "x][E1123 10:37:34"),
        "glued glog heads": rep("][E a:1"),
        "ansi, unterminated OSC": rep("\x1b]0;"),
        "ansi, CSI parameters": rep(";", "\x1b["),
        "srun, blanks": rep(" "),
        "pdsh host": rep("1", "a", ": "),
        "pdsh host, labels": rep(".a1", "n1"),
        "torchrun prefix, role": rep("a", "["),
        "torchrun prefix, digits": rep("1", "[a"),
        "mpirun prefix": rep("[1,"),
        "glog head in brackets": rep(":1", "[E"),
        "glog head, blanks": rep(" ", "[E1123 10:37:34.6"),
        "bare glog head": rep("a:1", "E1123 10:37:34.6 1 "),
        "python logging": rep("a.", "ERROR:"),
        "time stamp and level": rep("a.1", "2024-05-01 10:00:00 INFO "),
        "ray prefix": rep("a.", "("),
        "nccl head": rep("a/:1 ", "h:1:1 [0] "),
        "kubectl prefix": rep("a.", "[pod/"),
        "quoted": rep("> "),
        "interleaved ranks": rep("[rank1"),
    }


# whole files, for the reader's own prefix regexes (logs/keys.py): a first line that makes
# the reader's sniff turn a prefix layer on, then a 1 MB line that makes that layer backtrack
def pathological_files(size: int = 1 << 20) -> dict[str, tuple[str, str]]:
    def rep(token: str, prefix: str = "") -> str:
        return prefix + token * max(1, (size - len(prefix)) // len(token))

    return {
        "pdsh host label, digits": ("node1: starting\n", rep("1", "a")),
        "ray prefix, pid=": ("(Worker pid=5) starting\n", rep("pid=1", "(")),
        "ray prefix, groups": ("(Worker pid=5) starting\n", rep("(a) ")),
        "torchrun prefix, role": ("[default0]: starting\n", rep("a", "[")),
        "c10d rank under [rankN]:": ("[rank0]: starting\n",
                                     rep("[PG ID 0 PG GUID 0(default_pg) Rank ",
                                         "[rank1]:Watchdog ")),
        "srun label, blanks": ("0: starting\n", rep(" ")),
    }


def parse_seconds(line: str) -> float:
    from distdoctor.logs.lines import parse_raw

    t = time.perf_counter()
    parse_raw(line + "\n")
    return time.perf_counter() - t


def read_seconds(first: str, line: str, folder: str) -> float:
    """`diagnose --log`'s reading of a file of `first` three times, `line`, `first`."""
    from distdoctor.logs import scan_logs

    path = os.path.join(folder, "pathological.log")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(first * 3 + line + "\n" + first)
    try:
        t = time.perf_counter()
        scan_logs([path])
        return time.perf_counter() - t
    finally:
        os.unlink(path)


def time_lines(repeats: int, folder: str) -> dict[str, float]:
    read_seconds("x\n", "x", folder)  # the families' modules imported, their regexes compiled
    out = {}
    for name, line in pathological_lines().items():
        out[f"line: {name}"] = min(parse_seconds(line) for _ in range(repeats))
    for name, (first, line) in pathological_files().items():
        out[f"file: {name}"] = min(read_seconds(first, line, folder) for _ in range(repeats))
    return out


def time_diagnose(log: str) -> tuple[float, float, int]:
    """(wall s, peak RSS MB, exit code) of `diagnose --log LOG` in its own process."""
    cmd = [sys.executable, "-m", "distdoctor", "diagnose", "--log", log]
    gnu_time = shutil.which("time") if os.path.exists("/usr/bin/time") else None
    if gnu_time:
        proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
        wall = _gnu_field(proc.stderr, r"Elapsed \(wall clock\) time.*: (\S+)")
        rss_kb = _gnu_field(proc.stderr, r"Maximum resident set size \(kbytes\): (\d+)")
        return _seconds(wall), int(rss_kb) / 1000, proc.returncode
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - t, usage.ru_maxrss / 1000, os.waitstatus_to_exitcode(status)


def _gnu_field(text: str, pattern: str) -> str:
    m = re.search(pattern, text)
    return m.group(1) if m else "0"


def _seconds(clock: str) -> float:
    parts = [float(p) for p in clock.split(":")]
    return sum(p * 60 ** i for i, p in enumerate(reversed(parts)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--nccl-info", action="store_true")
    ap.add_argument("--lines-only", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="distdoctor-logscale-", dir=args.dir)
    try:
        worst = 0.0
        for name, s in time_lines(max(1, args.repeats), tmp).items():
            worst = max(worst, s)
            print(f"1 MB {name:46s} {s:7.3f} s")
        print(f"worst 1 MB line: {worst:.3f} s (goal < {LINE_GOAL_S} s)")
        if args.lines_only:
            return 0
        log = os.path.join(tmp, "job.log")
        size = write_log(log, args.ranks, args.nccl_info)
        best = None
        for _ in range(max(1, args.repeats)):
            run = time_diagnose(log)
            best = run if best is None or run[0] < best[0] else best
        wall, rss, code = best
        print(f"diagnose --log, {args.ranks:,} ranks ({size / 1e6:.0f} MB): {wall:.1f} s, "
              f"peak RSS {rss:.0f} MB, exit {code} (goal <= {GOAL_S} s, <= {GOAL_MB} MB)")
        print(f"(this process: peak RSS "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1000:.0f} MB)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
