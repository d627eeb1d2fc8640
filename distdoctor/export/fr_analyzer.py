"""PyTorch's own analyzer, torchfrtrace, run on a folder of dumps, and what it concluded,
read back from its log: the first problem it reports (it goes on to report the ops that
follow, which the first one threw out of step), that it found none, or how it failed.

Used to check that an export reads the way a real dump does (tests) and to set its answer
beside distdoctor's (benchmarks/fr_comparison.py). torchfrtrace prints to stderr, one
block per problem:

    Collective sequence number: 5 has errors          | Not all ranks joining collective, ...
    ...                                               | missing ranks: {1}
    error msg: Culprit rank 1; Error type: ...        | ...
    collective stack trace:                           | collective stack trace:
     all_reduce at /job/train.py:12                   |  ...
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

ANALYZER = "torch.distributed.flight_recorder.fr_trace"
_SEQ = re.compile(r"(?:sequence number:?\s*)(\d+)")
_RANKS = re.compile(r"\{([\d,\s]*)\}")
_FRAME = re.compile(r"^\s*(\S.*) at (.+):(\d+)\s*$")


@dataclass
class TorchVerdict:
    kind: str  # mismatch | missing_ranks | missing_dumps | undecided | none | failed
    ranks: tuple[int, ...] = ()  # the ranks it names: culprits, missing ranks or dumps
    seq: int | None = None  # collective_seq_id of the op it reports
    group: str | None = None  # "0:default_pg"
    op: str | None = None  # profiling name, "gloo:all_reduce"
    error: str | None = None  # its error type, or the last line of its traceback
    frames: list[tuple[str, str, int]] = field(default_factory=list)  # (function, file, line)
    problems: int = 0  # blocks it printed
    seconds: float = 0.0
    output: str = ""

    def summary(self) -> str:
        ranks = ",".join(map(str, self.ranks)) or "-"
        if self.kind == "none":
            return "no problem found"
        if self.kind == "failed":
            return f"failed: {self.error}"
        if self.kind == "missing_dumps" and self.seq is None:
            return f"refused: no dump from rank(s) {ranks}"
        what = {"mismatch": f"mismatch ({self.error or '?'}), culprit rank(s) {ranks}",
                "missing_ranks": f"rank(s) {ranks} not joining",
                "missing_dumps": f"undecided, no dump from rank(s) {ranks}",
                "undecided": "undecided"}[self.kind]
        return f"{what} at {self.op or '?'} #{self.seq}"


def _ranks(text: str) -> tuple[int, ...]:
    m = _RANKS.search(text)
    return tuple(sorted(int(x) for x in re.findall(r"\d+", m.group(1)))) if m else ()


def parse(output: str, returncode: int = 0) -> TorchVerdict:
    """What torchfrtrace's log says, first problem first."""
    lines = output.splitlines()
    v: TorchVerdict | None = None
    in_stack = False
    for i, line in enumerate(lines):
        text = line.strip()
        starts = ("Not all ranks joining collective" in text or
                  ("Collective sequence number" in text and "has errors" in text) or
                  "Input/output mismatch in the collective" in text)
        if starts:
            if v is None:
                kind = "missing_ranks" if text.startswith("Not all") else "mismatch"
                m = _SEQ.search(text)
                v = TorchVerdict(kind, seq=int(m.group(1)) if m else None)
            v.problems += 1
            in_stack = False
            continue
        if v is None or v.problems > 1:
            if v is None and "because we missed FR dumps from ranks" in text:
                v = TorchVerdict("missing_dumps", ranks=_ranks(text), problems=1)
            elif v is None and text.startswith("No errors found for this collective entry"):
                v = TorchVerdict("undecided", problems=1)
            continue
        if text.startswith("group info:"):
            v.group = text.split(":", 1)[1].strip()
        elif text.startswith("collective:"):
            v.op = text.split(":", 1)[1].strip()
        elif text.startswith("missing ranks:"):
            v.ranks = _ranks(text)
        elif text.startswith("error msg:"):
            v.ranks = tuple(sorted({int(r) for r in re.findall(r"Culprit rank (\d+)", text)}))
            m = re.search(r"Error type: (\w+)", text)
            v.error = m.group(1) if m else None
        elif text.startswith("collective stack trace:"):
            in_stack = True
        elif in_stack and (m := _FRAME.match(lines[i])):
            v.frames.append((m.group(1), m.group(2), int(m.group(3))))
        elif in_stack and text:
            in_stack = False
    if returncode != 0:
        last = next((x.strip() for x in reversed(lines) if x.strip()), "no output")
        if v is None:
            m = re.search(r"Missing dump files from ranks (\{[\d,\s]*\})", output)
            if m:
                return TorchVerdict("missing_dumps", ranks=_ranks(m.group(1)), error=last,
                                    output=output)
            return TorchVerdict("failed", error=last, output=output)
        v.error = v.error or last
    v = v or TorchVerdict("none")
    v.output = output
    return v


def run_torchfrtrace(folder, python: str = sys.executable, timeout: float = 120,
                     args: tuple = ()) -> TorchVerdict:
    """`python -m torch.distributed.flight_recorder.fr_trace FOLDER [ARGS]`, as a user
    types it, and what it concluded."""
    return run_torchfrtrace_all([folder], python, timeout, args)[0]


def run_torchfrtrace_all(folders, python: str = sys.executable, timeout: float = 120,
                         args: tuple = ()) -> list[TorchVerdict]:
    """The analyzer on each folder, all at once (each run is mostly torch's import)."""
    t0 = time.monotonic()
    procs = [subprocess.Popen([python, "-m", ANALYZER, str(f), *args], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
             for f in folders]
    out = []
    try:
        for proc in procs:
            text, _ = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
            v = parse(text, proc.returncode)
            v.seconds = time.monotonic() - t0
            out.append(v)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out
