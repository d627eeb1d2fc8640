"""How a log ends, said for every log: finished; failed with a cause; stopped with no error;
killed from outside; cut off. Read after the line-by-line pass, on the story's windows
(story.py) and the findings the families made.

- Each loud finding gets where in the story its first line falls ("after step 1,200",
  "at init, before the first step", "after training finished").
- A log with no error finding is judged from its end: a launcher's or scheduler's kill
  words in its last lines (killed from outside: who, which signal, what came before; not
  words the end of training follows, as a restart's or a helper process' SIGTERM);
  a stack dump it ends in, or NCCL's "Init COMPLETE" as the last word of every process
  before any step (stopped with no error: where, what came last, what repeated, how long).
  Those are warnings: a log that ends early is never silence. A log that just ends
  mid-training with no error is said in the read summary's "how it ends" (an excerpt, or a
  job still running: no finding), one that says it finished is quiet.
"""

from __future__ import annotations

import re
from collections import Counter

from distdoctor.findings import Finding
from distdoctor.logs.bounds import small_int
from distdoctor.logs.dumps import torn_words
from distdoctor.logs.lines import LogLine
from distdoctor.logs.problems import clip, short_path
from distdoctor.logs.repeats import template
from distdoctor.logs.story import (
    FINISHED,
    INIT,
    LAUNCH,
    STEP,
    STOPPED,
    FileStory,
    Milestone,
    Story,
    step_words,
)

LAST_LINES = 15  # a kill word this close to a file's end is how it ended
DUMP_NEAR_END = 400  # lines: a stack dump this close to the end is where it stood
MIN_REPEATS = 3
END_LINES = 20  # a file's last lines, for what it ends repeating

KILLED_REMEDY = ("The job was stopped from outside its processes, with no error of theirs in "
                 "this log: ask who stopped it (the scheduler's accounting, `sacct -j JOBID`; "
                 "`kubectl describe pod`; `dmesg -T | grep -i kill` for the OOM killer), and "
                 "read the output of the process that stopped first, if another log holds it.")
STUCK_REMEDY = ("The job stopped making progress without an error: the stack above is where "
                "it stood. Dump every rank the same way (`py-spy dump --pid PID`, "
                "faulthandler), and compare the ranks; a rank missing from a collective or a "
                "store key never written is the usual cause.")
TORN_REMEDY = ("Several processes dumped their stacks into one log at the same moment, and "
               "their lines tore: dump one rank at a time (`py-spy dump --pid PID`), or give "
               "each rank a file of its own (torchrun --tee 3 or --redirects 3 and --log-dir; "
               "`faulthandler.dump_traceback_later(T, file=...)` per rank), then compare the "
               "ranks' stacks.")
INIT_REMEDY = ("Every process finished NCCL's init and printed nothing more: the first "
               "collective or the first step never completed. Dump the ranks' stacks "
               "(`py-spy dump --pid PID`), and rerun with NCCL_DEBUG=INFO "
               "NCCL_DEBUG_SUBSYS=COLL TORCH_DISTRIBUTED_DEBUG=DETAIL to see which collective "
               "each rank is in.")
RESOLVE_REMEDY = ("The rendezvous address (MASTER_ADDR, --rdzv-endpoint) does not resolve "
                  "from this node: check it with `getent hosts NAME` on every node; use the "
                  "master's IP address, or the name every node's DNS knows (a pod's headless "
                  "service, the first host of `scontrol show hostnames`).")
_UNRESOLVED = re.compile(r"gai error|Name or service not known|cannot be resolved|could not "
                         r"resolve|getaddrinfo|Temporary failure in name resolution")
# frames of the interpreter and the stdlib that say nothing of where the program stood
_PLUMBING = re.compile(r"/threading\.py|/selectors\.py|/queue\.py|/socket\.py|<frozen ")
# a C++ backtrace's lines under a warning (c10's "frame #3: ..."): the warning repeats, not them
_TRACE_LINE = re.compile(r"\s*(?:frame #\d+: |<omitting python frames>|Exception raised from )")
_CLOCK = re.compile(r"(\d?\d):(\d\d):(\d\d)")
_NRANKS = re.compile(r"\bnranks (\d+)", re.I)


def annotate(found: list[Finding], story: Story, first_lines: dict) -> None:
    """Each loud finding says where in the story its first line was printed."""
    for f in found:
        if f.severity not in ("error", "warning"):
            continue
        where = story.where(first_lines.get(id(f)))
        if where is None:
            continue
        f.details["story"] = where
        if where not in f.summary:
            f.summary += f" ({where})"


def verdict(found: list[Finding], story: Story, truncated: bool) -> tuple[str, Finding | None]:
    """The words for how the log ends, and the finding that says it where no other does."""
    # a crash said as a warning (its job restarted and went on, a demoted cause) is the
    # ending's cause too: no second word on how it ended
    errors = [f for f in found if f.severity == "error"] or [
        f for f in found if f.severity == "warning" and f.kind == "crash"]
    if errors:
        return "failed: " + clip(errors[0].summary, 100), None
    stalls = [f for f in found if f.details.get("family") == "stall"]
    if stalls:  # the log ends in one line over and over (repeats.py): said already
        for f in stalls:
            _name_the_wait(f)
        return "stopped with no error", None
    killed = _killed(story)
    if killed is not None:
        return "killed from outside", killed
    stuck = _stuck(story)
    if stuck is not None:
        return "stopped with no error", stuck
    if story.all(FINISHED):
        return "finished", None
    if truncated:
        return "cut off mid-line", None
    last = story.last_progress()
    if last is not None:  # an excerpt, or a job still running: said, not alarmed
        return (f"ends mid-run with no error and no end of training (last progress: "
                f"{step_words(last)})"), None
    return "ends with no error and no end of training", None


# --- killed from outside ---------------------------------------------------------------------
def _killed(story: Story) -> Finding | None:
    for fs in story.files.values():
        if not fs.tail:
            continue
        near = fs.tail[-1].lineno - LAST_LINES
        # the end of training said after a stop word: the signal was a restart's (a
        # torchelastic scale event, a failed attempt) and the job went on to finish
        done = max((m.line.lineno for m in fs.milestones if m.kind == FINISHED), default=0)
        stops = [m for m in fs.milestones if m.kind == STOPPED
                 and m.line.lineno > max(near, done)]
        if not stops:
            continue
        first = stops[0]
        who, sig = _who_stopped(stops)
        at = next((i for i, ll in enumerate(fs.tail) if ll is first.line), None)
        before = fs.tail[:at] if at is not None else [
            ll for ll in fs.tail if ll.lineno < first.line.lineno]
        came = clip(before[-1].text.strip(), 120) if before else ""
        where = story.where(first.line)
        at = f" {where}" if where else ""
        summary = (f"the job was killed from outside{at}: {who}"
                   f"{f' ({sig})' if sig else ''}; no error of its processes is in this log")
        if came:
            summary += f"; the last line before it: {came!r}"
        f = _ending("crash", summary, KILLED_REMEDY, "killed_from_outside", "killed",
                    "killed from outside", where, lines=[m.text[:300] for m in stops[:4]])
        _last_progress(f, story)
        return f
    return None


def _who_stopped(stops: list[Milestone]) -> tuple[str, str | None]:
    text = " ".join(m.text for m in stops)
    sig = re.search(r"SIG[A-Z]+", text)
    signame = sig.group(0) if sig else None
    num = re.search(r"got signal: (\d+)", text)
    if signame is None and num:
        signame = {"15": "SIGTERM", "9": "SIGKILL", "2": "SIGINT", "1": "SIGHUP"}.get(
            num[1], f"signal {num[1]}")
    code = re.search(r"command terminated with exit code (\d+)", text)
    if signame is None and code:  # a container's exit code 128 + N: killed by signal N
        signame = {"137": "SIGKILL", "143": "SIGTERM", "134": "SIGABRT"}.get(code[1])
    if code:
        return ("the container was ended (`kubectl` reports exit code "
                f"{code[1]}: the OOM killer or the node when SIGKILL)", signame)
    pids = re.findall(r"Killing subprocess (\d+)", text)
    if pids:
        return (f"the launcher killed its worker processes (pid {', '.join(pids[:8])}), as "
                f"DeepSpeed's launcher does when it is signalled or a worker exits", signame)
    m = re.search(r"CANCELLED AT (\S+)(?: DUE TO ([A-Z ]+))?", text)
    if m:
        return f"Slurm cancelled it at {m[1]}" + (f" ({m[2].strip().lower()})" if m[2] else ""), (
            signame)
    if "death signal" in text or "got signal" in text:
        return "torchrun's agent was signalled and stopped its workers", signame
    if "closing signal" in text:
        return "the launcher sent its workers a closing signal", signame
    if "srun:" in text:
        return "srun terminated the job step", signame
    return f"the processes were ended ({clip(stops[0].text, 60)!r})", signame


# --- stopped with no error -------------------------------------------------------------------
def _stuck(story: Story) -> Finding | None:
    for fs in story.files.values():
        if (fs.dump.frames or fs.dump.torn) and fs.tail \
                and fs.tail[-1].lineno - _dump_line(fs) <= DUMP_NEAR_END:
            return _stuck_in_dump(story, fs) if fs.dump.frames else _stuck_torn(story, fs)
    ends = [fs for fs in story.files.values() if fs.tail]
    if ends and not story.all(STEP) and _ends_at_init(ends):
        return _stuck_at_init(story, ends)
    for fs in ends:
        found = _ends_unresolved(story, fs)
        if found is not None:
            return found
    return None


def _name_the_wait(f: Finding) -> None:
    """A stall whose repeated line says what it waits on gets the cause's remedy."""
    if _UNRESOLVED.search(f.summary) and "could not be resolved" not in f.summary:
        f.summary += ": the store's address could not be resolved"
        f.remedy = RESOLVE_REMEDY


def _ends_unresolved(story: Story, fs: FileStory) -> Finding | None:
    """A file that ends repeating that the rendezvous address does not resolve (warned on
    every retry, nothing else after): the job never got past its store."""
    last = fs.tail[-END_LINES:]
    hits = [ll for ll in last if _UNRESOLVED.search(ll.text)]
    if len(hits) < MIN_REPEATS or not any(_UNRESOLVED.search(ll.text) for ll in last[-3:]):
        return None
    if any(m.kind == STEP and m.line.lineno > hits[0].lineno for m in fs.milestones):
        return None
    where = story.where(hits[0])
    span = _span(hits[0], hits[-1])
    over = f" over {span:.0f} s" if span else ""
    summary = (f"the job stopped with no error{f' {where}' if where else ''}: it ends "
               f"repeating {clip(hits[-1].text.strip(), 140)!r} ({len(hits)} times{over}): "
               f"the store's address could not be resolved")
    return _ending("hang", summary, RESOLVE_REMEDY, "stopped_unresolved", "unresolved",
                   "stopped with no error", where, lines=[hits[-1].text[:300]],
                   repeats=len(hits))


def _dump_line(fs: FileStory) -> int:
    for ll in reversed(fs.tail):
        if "most recent call first" in ll.text or ll.text.startswith("Timeout ("):
            return ll.lineno
    return fs.tail[-1].lineno


def _dump_start(fs: FileStory) -> LogLine:
    """The first line the tail holds of its last dump (where the story places it)."""
    start = _dump_line(fs)
    return next((ll for ll in fs.tail if ll.lineno >= start), fs.tail[-1])


def _stuck_in_dump(story: Story, fs: FileStory) -> Finding:
    dump = fs.dump.frames
    frames = [fr for fr in dump if not _PLUMBING.search(fr["file"])] or dump
    top = frames[0]
    at = f"{top['function']} ({short_path(top['file'])}:{top['line']})"
    start = _dump_line(fs)
    where = story.where(_dump_start(fs)) or ("at init, before the first step"
                                   if any(m.kind in (INIT, LAUNCH) for m in fs.milestones)
                                   and not story.all(STEP) else None)
    where_words = f" {where}" if where else ""
    summary = f"the job stopped with no error{where_words}: a stack dump shows it stuck in {at}"
    user = [fr for fr in frames if "site-packages" not in fr["file"]
            and "/lib/python" not in fr["file"]]
    if user and user[0] is not top:
        summary += f", called from {user[0]['function']} ({short_path(user[0]['file'])}:" \
                   f"{user[0]['line']})"
    rep = _repeated_before(fs, start)
    remedy = STUCK_REMEDY
    if rep:
        summary += f"; before it, {rep}"
        if _UNRESOLVED.search(rep):  # the cause the warnings told, not the stack's symptom
            summary += ": the store's address could not be resolved"
            remedy = RESOLVE_REMEDY
    f = _ending("hang", summary, remedy, "stopped_no_error", "stuck",
                "stopped with no error", where, frames=dump[:12])
    f.callsites = [dict(fr) for fr in (user or frames)[:1]]
    _last_progress(f, story)
    return f


def _stuck_torn(story: Story, fs: FileStory) -> Finding:
    """Stack dumps near the end, every one torn by another written at once: the job was
    dumped (as a stuck job is), and where it stood is not claimed."""
    where = story.where(_dump_start(fs))
    summary = (f"the job stopped with no error{f' {where}' if where else ''}: "
               f"{torn_words(fs.dump.heads)}")
    f = _ending("hang", summary, TORN_REMEDY, "stopped_no_error", "stuck",
                "stopped with no error", where, dump="torn", stacks=fs.dump.heads)
    _last_progress(f, story)
    return f


def _ends_at_init(ends: list[FileStory]) -> bool:
    """Every process the tails show printed NCCL's Init COMPLETE as its last line, and
    nothing of the program follows (a benchmark's table printed after it is its run)."""
    for fs in ends:
        done = [i for i, ll in enumerate(fs.tail) if "Init COMPLETE" in ll.text]
        if not done or any("NCCL INFO" not in ll.text for ll in fs.tail[done[-1] + 1:]):
            return False
    last_of: dict = {}
    for fs in ends:
        for ll in fs.tail:
            last_of[ll.who] = ll
    if len(last_of) > 1:
        last_of.pop(None, None)  # a banner no process label claims ("NCCL version ...")
    done = [ll for ll in last_of.values() if "Init COMPLETE" in ll.text]
    if not done or len(done) != len(last_of):
        return False
    # two processes at least, of one communicator (an excerpt showing one rank's init
    # proves nothing of the others)
    # (a node's share of a bigger world counts: its processes all stopped there too)
    worlds = {small_int(m[1]) for ll in done if (m := _NRANKS.search(ll.text))}
    return len(worlds) == 1 and len(done) >= 2


def _stuck_at_init(story: Story, ends: list[FileStory]) -> Finding:
    procs = {ll.who for fs in ends for ll in fs.tail}
    if len(procs) > 1:
        procs.discard(None)
    summary = (f"the job stopped with no error at init, before the first step: NCCL's last "
               f"word from every process ({len(procs)}) was Init COMPLETE, and nothing "
               f"followed")
    return _ending("hang", summary, INIT_REMEDY, "stopped_at_init", "init",
                   "stopped with no error", "at init, before the first step",
                   lines=[ends[-1].tail[-1].text[:300]])


def _ending(kind: str, summary: str, remedy: str, rule: str, signature: str, ending: str,
            where: str | None, **details) -> Finding:
    """A warning of how the log ended (`ending`), at `where` in the job's story if known;
    `details`: its evidence (lines, frames, repeats)."""
    f = Finding(kind, "warning", summary, remedy=remedy, details={
        "source": "log", "family": "ending", "rule": rule,
        "signature": f"log/ending/{signature}", **details, "ending": ending})
    if where:
        f.details["story"] = where
    return f


def _repeated_before(fs: FileStory, before: int) -> str | None:
    """What the lines before `before` repeat: "'...' printed 12 times over 110 s"."""
    lines = [ll for ll in fs.tail if ll.lineno < before and not _TRACE_LINE.match(ll.text)]
    lines = lines[-200:]
    if not lines:
        return None
    counts = Counter(template(ll.text[:2000])[0] for ll in lines)
    tmpl, n = counts.most_common(1)[0]
    if n < MIN_REPEATS:
        return None
    same = [ll for ll in lines if template(ll.text[:2000])[0] == tmpl]
    span = _span(same[0], same[-1])
    over = f" over {span:.0f} s" if span else ""
    return f"{clip(same[-1].text.strip(), 140)!r} printed {n} times{over}"


def _span(a, b) -> float | None:
    ta, tb = _secs(a), _secs(b)
    return float((tb - ta) % 86400) if ta is not None and tb is not None else None


def _secs(ll) -> float | None:
    m = _CLOCK.search(ll.when or "") or _CLOCK.search(ll.text[:60])
    return int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]) if m else None


def _last_progress(f: Finding, story: Story) -> None:
    last = story.last_progress()
    if last is not None:
        f.details["last_progress"] = {"step": last.step, "total": last.total,
                                      "line": last.line.lineno, "text": last.text[:200]}
        if step_words(last) not in f.summary:
            f.summary += f"; last progress: {step_words(last)}"

