"""The job's story: launch, rendezvous and init, steps, evaluation, saving, the end, read
from the windows of each file that tell it (its head and its tail), after the line-by-line
pass and never inside it.

A failure means different things at different points of that story: a store that never
fills before the first step is a wiring problem, the same error after step 1,200 is not,
and a scheduler's time limit after the run said it finished is a process that did not
exit. `Story.where(line)` says where a line falls ("at init, before the first step",
"after step 1,200", "after training finished"); ending.py says how the log ends.

Bounded by construction: each file's first and last WINDOW bytes (less per file when there
are many files), parsed with the file's own prefixes peeled; a milestone is kept per line
that matches one of a few patterns, so a million-line log costs what two windows cost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from distdoctor.logs.bounds import small_int
from distdoctor.logs.decoded import open_log
from distdoctor.logs.dumps import Dump, read_last_dump
from distdoctor.logs.lines import LogLine, parse_raw

WINDOW = 256 << 10  # bytes read at the end of a file (repeats.py reads this tail too)
HEAD_WINDOW = 64 << 10  # and at its start: launch and init are its first lines
ALL_FILES_BUDGET = 16 << 20  # over every file: many per-rank files share it
MIN_WINDOW = 16 << 10
MAX_FILES = 256  # files whose windows are read (the first ones: a glob's order)
NEAR_LAUNCH = 40  # lines after a launcher's banner that are still its start-up
MAX_TEXT = 2000  # of a line matched against the milestones (a line of a million ranks)

LAUNCH, INIT, INIT_DONE, STEP, EVAL, SAVE, FINISHED, STOPPED = (
    "launch", "init", "init_done", "step", "eval", "save", "finished", "stopped")

# One alternation, one search per line; the group that matched names the milestone.
# Sources of the words: torchrun's banner and elastic agent (torch/distributed/run.py,
# elastic/agent/server/api.py), DeepSpeed's launcher (launcher/launch.py), Slurm's
# slurmstepd (req.c), NCCL's init.cc, HF Trainer's and Lightning's end-of-training lines.
_MILESTONES = re.compile(
    r"(?P<stopped>Killing subprocess \d+|Sending process \d+ closing signal SIG\w+|"
    r"Received (?:Signals\.)?SIG\w+ death signal|got signal: \d+|CANCELLED AT \S+|"
    r"srun: (?:Force Terminated|forcing job termination|Job step aborted)|"
    r"Main process received SIG\w+|[Rr]eceived (?:signal )?SIG(?:TERM|INT|KILL|HUP)\b|"
    r"command terminated with exit code (?:13[47]|143)\b|"
    r"^(?:Terminated|Killed)\s*$)"
    r"|(?P<finished>\b(?:[Tt]raining (?:is )?(?:completed?|finished|done)\b|"
    r"[Ff]inished training|[Dd]one training\b|train_runtime|[Tt]raining took|[Tt]raining complete\b|"
    r"`Trainer\.fit` stopped|[Rr]un finished))"
    r"|(?P<save>\b(?:[Ss]av(?:ing|ed?)\b.{0,60}?(?:checkpoint|model|weights|state)|"
    r"[Cc]heckpoint (?:saved|written)))"
    r"|(?P<eval>\b(?:[Ee]valuat(?:ing|ion)\b|[Vv]alidat(?:ing|ion)\b|\beval[_ ](?:loss|step)))"
    r"|(?P<init_done>Init COMPLETE|Completed store-based barrier|[Pp]rocess group initialized)"
    r"|(?P<init>\b(?:[Rr]endezvous|init_process_group|Initializing (?:distributed|process group)"
    r"|MASTER_ADDR|NCCL version|Init START|Bootstrap :|_create_c10d_store|TCPStore))"
    r"|(?P<launch>spawned with command|Setting OMP_NUM_THREADS|Starting elastic_operator|"
    r"torch\.distributed\.run|entrypoint|[Ll]aunching (?:training|job|\d+ processes))")
# a step's report, with its number: "step 30 | loss", "Step 0 |", "step:  3  loss",
# "iteration      184/  250000", "global_step=1200", "[Epoch 2][Iter 300/500]"
# (the blanks around the ":" in one run or two, never two runs that both take blanks: a
# "step" followed by a run of blanks is read once, not once per way to split it)
_STEP = re.compile(r"\b(?:[Ss]tep|STEP|[Ii]ter(?:ation)?|global_step)\b\s*(?:[:=#]\s*)?"
                   r"(\d[\d,]{0,24})(?:\s*/\s*(\d[\d,]{0,24}))?")
_STEP_WORDS = re.compile(r"\bloss\b|\blr\b|learning.rate|tok/s|tokens?/s|grad.norm|\bmfu\b|"
                         r"elapsed|samples|\|", re.I)
# a tqdm bar: " 37%|███▋ | 370/1000 [12:01<20:28,  1.95s/it]"
_BAR = re.compile(r"(\d{1,3})%\|[^|]{0,120}\|\s*(\d+)/(\d+)\s*\[")


@dataclass(slots=True)
class Milestone:
    kind: str
    line: LogLine
    step: int | None = None  # for STEP: the number printed
    total: int | None = None  # "370/1000": the bar's or the schedule's end
    text: str = ""


@dataclass
class FileStory:
    path: str
    milestones: list[Milestone] = field(default_factory=list)
    tail: list[LogLine] = field(default_factory=list)  # the tail window's lines, in order
    tail_raw: list[str] = field(default_factory=list)  # the raw line of each (its clock)
    head: list[LogLine] = field(default_factory=list)  # the head window's (when not whole)
    head_end: int = 0  # the last line number the head window holds
    tail_start: int = 0  # the first line number the tail window holds
    whole: bool = False  # the windows hold every line of the file
    dump: Dump = field(default_factory=Dump)  # its last stack dump (dumps.py)

    def before(self, lineno: int, line: LogLine | None = None) -> list[Milestone]:
        """The milestones before line `lineno`; with `line`, also the steps drawn earlier on
        the same raw line ('\r' redraws of a bar, then the line itself glued on)."""
        out = []
        for m in self.milestones:
            if m.line is line or m.line.lineno > lineno:
                break
            if m.line.lineno < lineno or m.kind == STEP:
                out.append(m)
        return out

    def lines_before(self, lineno: int, n: int) -> list[LogLine]:
        """Up to `n` lines the windows hold just before line `lineno` (none where the line
        is in neither window)."""
        for lines in (self.tail, self.head):
            if lines and lines[0].lineno <= lineno <= lines[-1].lineno + 1:
                return [ll for ll in lines if ll.lineno < lineno][-n:]
        return []


class Story:
    """Each file's milestones and tail, and where a line falls among them."""

    def __init__(self, files: dict[str, FileStory]):
        self.files = files
        self.mid_run = False  # the log starts mid-run (window.py): its start is not the job's

    def where(self, line: LogLine | None) -> str | None:
        """Where in the job's story `line` was printed, in words, or None where the windows
        do not tell (a line deep inside a big file with no step seen before it)."""
        if line is None:
            return None
        fs = self.files.get(line.file)
        if fs is None:
            return None
        before = fs.before(line.lineno, line)
        if any(m.kind == FINISHED for m in before):
            return "after training finished"
        steps = [m for m in before if m.kind == STEP]
        if steps:  # the failing process's own last step where it printed steps
            own = [m for m in steps if line.who is not None and m.line.who == line.who]
            return f"after {step_words((own or steps)[-1])}"
        # no step before it: certain only where the head window reaches the line, and the
        # log shows the job's start (launch or init words before it)
        if (fs.whole or line.lineno <= fs.head_end) and not self.mid_run:
            if any(m.kind in (INIT, INIT_DONE) for m in before) or any(
                    m.kind == LAUNCH and line.lineno - m.line.lineno <= NEAR_LAUNCH
                    for m in before):
                return "at init, before the first step"
            if any(m.kind == LAUNCH for m in before):  # a program that prints no steps
                return "before any step this log shows"
        return None

    def last_progress(self) -> Milestone | None:
        """The last step or bar position printed (of the last file that shows one; within
        a line of '\r' redraws, the last drawn)."""
        for fs in reversed(list(self.files.values())):
            steps = [m for m in fs.milestones if m.kind == STEP]
            if steps:
                return steps[-1]
        return None

    def all(self, kind: str) -> list[Milestone]:
        return [m for fs in self.files.values() for m in fs.milestones if m.kind == kind]


def step_words(m: Milestone) -> str:
    if m.step is None:
        return f"the progress line {m.text[:80]!r}"
    if m.total:
        return f"step {m.step:,}/{m.total:,}"
    return f"step {m.step:,}"


def read_story(files: list[str], file_lines: dict[str, int] | None = None,
               heads: dict | None = None) -> Story:
    """The story of `files` from their windows (`file_lines`, `heads`: the reader's line
    counts and learned heads, so lines are numbered as the reader numbered them)."""
    shown = files[:MAX_FILES]
    window = max(MIN_WINDOW, min(WINDOW, ALL_FILES_BUDGET // (2 * max(1, len(shown)))))
    out = {}
    for path in shown:
        try:
            out[path] = _file_story(path, window, (file_lines or {}).get(path),
                                    (heads or {}).get(path))
        except (OSError, EOFError, ValueError):
            continue  # the reader has said what it could not read
    return Story(out)


def _file_story(path: str, window: int, total: int | None, head) -> FileStory:
    with open_log(path) as fh:
        first = fh.read(min(window, HEAD_WINDOW))
        if len(first) < min(window, HEAD_WINDOW):  # the whole file in one window
            head_raw, tail_raw, whole = first, b"", True
        elif hasattr(fh, "seekable") and fh.seekable() and not path.endswith(".gz"):
            size = fh.seek(0, 2)
            start = max(len(first), size - window)
            fh.seek(start)
            tail_raw, whole = fh.read(), start == len(first)
            head_raw = first
            if whole:  # the two windows meet: one buffer, no line cut between them
                head_raw, tail_raw = first + tail_raw, b""
        else:  # a .gz: read through, keeping the last window
            tail_raw = b""
            while chunk := fh.read(8 << 20):
                tail_raw = (tail_raw + chunk)[-window:]
            head_raw, whole = first, False
    fs = FileStory(path, whole=whole)
    head_lines = head_raw.split(b"\n")
    if not whole and len(head_lines) > 1:
        head_lines = head_lines[:-1]  # cut by the window's end
    fs.head_end = len(head_lines)
    _read_lines(fs, head_lines, 1, head, fs.tail if whole else fs.head,
                fs.tail_raw if whole else None)
    if tail_raw:
        tail_lines = tail_raw.split(b"\n")
        if not whole and len(tail_lines) > 1:
            tail_lines = tail_lines[1:]  # cut by the window's start
        if tail_lines and tail_lines[-1] == b"":
            tail_lines.pop()
        count = total if total is not None else None
        start = (count - len(tail_lines) + 1) if count and count >= len(tail_lines) else (
            fs.head_end + 1)
        fs.tail_start = start
        _read_lines(fs, tail_lines, start, head, fs.tail, fs.tail_raw)
    else:
        fs.tail_start = 1
    fs.dump = read_last_dump(fs.tail)
    return fs


def _read_lines(fs: FileStory, raws: list[bytes], first: int, head, keep: list,
                keep_raw: list | None) -> None:
    for i, raw in enumerate(raws, first):
        if not raw.strip():
            continue
        text = raw.decode("utf-8", "replace")
        for ll in parse_raw(text, file=fs.path, lineno=i, head=head):
            if not ll.text.strip():
                continue
            keep.append(ll)
            if keep_raw is not None:
                keep_raw.append(text)
            m = milestone(ll)
            if m is not None:
                fs.milestones.append(m)


def milestone(ll: LogLine) -> Milestone | None:
    """The milestone a line marks, if any."""
    text = ll.text[:MAX_TEXT]
    bar = _BAR.search(text) if "%|" in text else None
    if bar and None not in (n := (small_int(bar[2]), small_int(bar[3]))):
        return Milestone(STEP, ll, n[0], n[1], text.strip())
    m = _MILESTONES.search(text)
    if m is not None and m.lastgroup not in (None, "eval", "save", "init", "launch"):
        return Milestone(m.lastgroup, ll, text=text.strip())
    s = _STEP.search(text)
    if s is not None and _STEP_WORDS.search(text):
        total = int(s[2].replace(",", "")) if s[2] else None
        return Milestone(STEP, ll, int(s[1].replace(",", "")), total, text.strip())
    if m is not None and m.lastgroup:
        return Milestone(m.lastgroup, ll, text=text.strip())
    return None
