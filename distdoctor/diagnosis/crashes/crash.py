"""crash: a rank whose process died, and the ranks left waiting for it."""

from __future__ import annotations

import signal
from dataclasses import dataclass, replace

from distdoctor.diagnosis.crashes.phase import crash_phase
from distdoctor.diagnosis.hangs.hang import RankView, _fmt_op
from distdoctor.exits import signal_name
from distdoctor.findings import Finding, callsite_of, error_text


@dataclass(frozen=True)
class ExitInfo:
    code: int | None  # exit status; negative: killed by that signal (Popen convention)
    how: str = "exit"  # "exit": status known | "closed": exited through its atexit hook,
    #                    status unknown | "raised": an uncaught exception ended it
    #                    | "vanished": heartbeat stopped and the pid is gone
    #                    | "unheard": a rank on another host whose heartbeat stopped (dead,
    #                      or its node or the link to it is down: no one here can tell)
    #                    | "stopped": distdoctor stopped it (after a failure or a hang)
    exception: dict | None = None  # "raised": {type, message, file, line, function}
    call: dict | None = None  # "exit": the sys.exit/os._exit call {type, code, file, line, ...}

    @classmethod
    def of_closed_log(cls, header) -> ExitInfo:
        """A log its rank closed on the way out: normally, through os._exit (its status
        known), or on an uncaught exception."""
        if header.exception is not None:
            return cls(None, "raised", header.exception)
        if header.exit_code is not None:
            return cls(header.exit_code, call=header.exit_call)
        return cls(None, "closed")

    def where(self) -> dict:
        """{file, line, function} of the line that ended the rank: where it raised or
        called sys.exit / os._exit; {} when unknown."""
        at = self.exception if self.how == "raised" else self.call
        return {k: at[k] for k in ("file", "line", "function") if k in at} if (
            at and at.get("file")) else {}

    def describe(self) -> str:
        if self.how == "raised":
            e = self.exception or {}
            where = (f" at {e['file']}:{e['line']} in {e.get('function', '?')}"
                     if e.get("file") else "")
            return (f"raised {e.get('type', 'an exception')}: "
                    f"{error_text(str(e.get('message', '')), 200)}{where}")
        if self.how == "stopped":
            return "was stopped by distdoctor"
        if self.how == "closed":
            return "has exited (it shut down normally; exit status unknown)"
        if self.how == "vanished":
            return "died (its process is gone and its heartbeat stopped; exit status unknown)"
        if self.how == "unheard":
            return ("has not been heard from (its heartbeat stopped: it died, or its node "
                    "or the link to that node is down)")
        if self.code is None:
            return "exited"
        if self.code < 0:
            name = signal_name(-self.code)
            hint = " (the OOM killer, a user, or the launcher)" if name == "SIGKILL" else ""
            return f"was killed by {name}{hint}"
        text = f"exited with code {self.code}"
        at = self.where()
        if at:
            said = self.call.get("message")
            text += (f" through {self.call.get('type', 'an exit call')}"
                     + (f" ({error_text(said, 120)!r})" if said else "")
                     + f" at {at['file']}:{at['line']} in {at.get('function', '?')}")
        if self.call and self.call.get("skip"):
            text += f" (torch's test harness skipping the test: {self.call['skip']})"
        return text

    @property
    def failed(self) -> bool:
        return self.how in ("vanished", "unheard", "raised") or (
            self.how == "exit" and self.code is not None and self.code != 0
            and not (self.call or {}).get("skip"))


def crash_findings(exits: dict[int, ExitInfo], views: dict[int, RankView],
                   open_rv, mismatched: set = frozenset(),
                   span_of_rank=lambda rank: None, history_of_rank=lambda rank: ()
                   ) -> list[Finding]:
    """`mismatched`: (group, seq) of collectives reported as mismatched; a rank that dies
    inside one, or inside a later op of that group (gloo aborts on a size mismatch, and
    once the ranks' ops are out of step, on the ops after it), died of the mismatch.
    `span_of_rank(rank)`: the step it was in when it ended; `history_of_rank(rank)`: its
    recent ops, which with the line it ended at give its phase (phase.py)."""
    open_rv = list(open_rv)
    out = []
    for rank in sorted(exits):
        info = exits[rank]
        if not info.failed:
            continue
        view = views.get(rank)
        latest = view.latest if view else None
        waiting = sorted({r for rv in open_rv if rank in rv.missing
                          for r, e in rv.arrivals.items() if e.t_end_ns is None
                          and r not in exits})
        last = f"; its last op was {_fmt_op(latest)}" if latest else "; it issued no op"
        if latest is not None and latest.t_end_ns is None:
            last = f"; it died inside {_fmt_op(latest)}"
        # a rank that exits because its collective failed is a consequence, not a cause;
        # so is one that vanished after such a failure (under a wrapped torchrun there is
        # no exit code: the launcher tears the rank down once its error surfaced)
        ended_by_failure = info.how in ("vanished", "unheard", "raised") or (
            info.how == "exit" and (info.code or 0) > 0)
        consequence = (ended_by_failure and latest is not None
                       and latest.status in ("error", "timeout"))
        # died while waiting for a rank that had died already: the launcher's teardown
        # (torchrun stops every rank when one fails) or the wait's failure, not a cause
        waited_for_dead = sorted({
            m for rv in open_rv if rank in rv.arrivals
            and rv.arrivals[rank].index == (latest.index if latest else -1)
            for m in rv.missing if m != rank and m in exits and exits[m].failed})
        if latest is not None and any(g == latest.group and latest.seq >= s
                                      for g, s in mismatched):
            consequence = True
            last += " (a consequence of the mismatch there)"
        elif waited_for_dead and latest is not None and latest.t_end_ns is None:
            consequence = True
            last += (f", waiting for rank {', '.join(map(str, waited_for_dead))} that had "
                     f"died (a consequence)")
        elif consequence:
            last = f" after {_fmt_op(latest)} failed ({error_text(latest.error or latest.status)})"
        span = span_of_rank(rank)
        phase = crash_phase(info.where(), history_of_rank(rank), span) if info.where() \
            else None
        said = phase["text"] if phase else (f"in {span}" if span else "")
        summary = f"crash: rank {rank} {info.describe()}{f', {said}' if said else ''}{last}"
        if waiting:
            summary += f"; ranks {', '.join(map(str, waiting))} are left waiting for it"
        details = {"exit_code": info.code, "how": info.how, "span": span, "phase": phase,
                   "waiting_ranks": waiting,
                   "consequence_of_failed_collective": consequence,
                   "last_op": None if latest is None else {
                       "op": latest.op, "group": latest.group, "seq": latest.seq,
                       "in_flight": latest.t_end_ns is None}}
        callsites = [callsite_of(rank, latest.callsite)] if latest is not None else []
        ended_at = info.where()
        if ended_at:  # where it raised or called sys.exit comes first
            callsites.insert(0, {"rank": rank, **ended_at})
        if info.exception and info.exception.get("file"):
            details["exception"] = info.exception
        if info.call and info.call.get("file"):
            details["exit_call"] = info.call
        remedy = _REMEDY_SIGKILL if info.code == -signal.SIGKILL else _REMEDY
        out.append(Finding("crash", "warning" if consequence else "error", summary, [rank],
                           latest.group if latest else None, latest.seq if latest else None,
                           callsites, details=details, remedy=remedy))
    return out


_REMEDY = ("Read the rank's own output for its traceback (the first failure is the cause; "
           "the others' errors are consequences).")
_REMEDY_SIGKILL = ("SIGKILL leaves no traceback: check `dmesg` / the container's events for the "
                   "OOM killer, and the host's memory; reduce batch size or activation memory.")


def merge_crashes(found: list[Finding], all_ranks: set[int]) -> list[Finding]:
    """One finding per problem, not one per rank:
    - a crash the job's output explains (a traceback, an OOM: findings with source "log")
      replaces the exit-code crash of the same rank (of the same incarnation), unless the
      tracer saw that rank's exception itself: then that one stays and the log's goes
      (but a failure the log tells shared by several ranks stays one finding);
    - ranks that all failed the same way before issuing any op (a start-up error, an
      argparse usage error) are one finding."""
    def at(f: Finding) -> set:
        return {(r, f.details.get("incarnation")) for r in f.ranks}

    found = _fold_dead_threads(found)
    crashes = [f for f in found if f.kind == "crash" and f.severity == "error" and f.ranks]

    def seen_end(f: Finding) -> bool:
        return bool(f.details.get("exception") or f.details.get("exit_call"))

    # the tracer saw the exception (its excepthook) or the sys.exit call itself: that
    # finding is the richer one
    raised = {x for f in crashes if f.details.get("source") != "log" and seen_end(f)
              for x in at(f)}
    from_log = {x for f in crashes if f.details.get("source") == "log" for x in at(f)}
    # ... except where the log tells one failure shared by several ranks (every rank's
    # KeyError, an OOM on two): that one finding, not one per rank
    shared = {x for f in crashes if f.details.get("source") == "log" and len(f.ranks) > 1
              for x in at(f)}
    out = [f for f in found if not (f in crashes and (
        at(f) <= raised and len(f.ranks) == 1 if f.details.get("source") == "log"
        else at(f) <= shared or not seen_end(f) and at(f) <= from_log))]
    _keep_steps(crashes, [f for f in out if f in crashes and f.details.get("source") == "log"])
    _not_at_startup(crashes, [f for f in out if f.details.get("source") == "log" and (
        f.details.get("family") == "startup" or f.details.get("mid_run") == _OP_UNKNOWN)])
    same: dict[tuple, list[Finding]] = {}
    for f in out:
        d = f.details
        if f.kind != "crash" or d.get("source") == "log" or d.get("last_op") is not None \
                or len(f.ranks) != 1:
            continue
        exc = d.get("exception") or {}
        key = (d.get("how"), d.get("exit_code"), exc.get("type"), exc.get("message"))
        same.setdefault(key, []).append(f)
    for group in same.values():
        if len(group) < 2:
            continue
        ranks = sorted(r for f in group for r in f.ranks)
        every = set(ranks) >= all_ranks
        who = f"every rank ({_ranks(ranks)})" if every else f"ranks {_ranks(ranks)}"
        first = group[0]
        what = first.summary.split(f"rank {first.ranks[0]} ", 1)[-1].split("; it issued no op")[0]
        merged = Finding("crash", "error", f"crash: {who} failed at start-up, before any "
                         f"collective: {what}", ranks, callsites=first.callsites[:1],
                         details={**first.details, "family": "startup", "ranks": ranks},
                         remedy="Every rank failed the same way before training began: fix "
                                "that one error (the first rank's output shows it).")
        out = [f for f in out if f not in group] + [merged]
    return out


def _fold_dead_threads(found: list[Finding]) -> list[Finding]:
    """A thread's uncaught exception the log tells (logs/families/exceptions.py), on a rank
    whose own crash the tracer saw: said in that crash as what came before it (a prefetch
    thread that died, then the main thread that gave up on its queue), not as a crash of
    its own that the rank's would replace."""
    threads = [f for f in found if f.kind == "crash" and f.details.get("thread")
               and f.details.get("source") == "log" and f.ranks]
    if not threads:
        return found
    out, folded = [], []
    for g in found:
        t = None
        if g.kind == "crash" and g.severity == "error" and len(g.ranks) == 1 \
                and g.details.get("source") != "log":
            t = next((f for f in threads if g.ranks[0] in f.ranks and f.details.get(
                "incarnation") == g.details.get("incarnation")), None)
        if t is not None:  # a new finding: the engine's own is merged again at each look
            g = replace(g, summary=f"{g.summary}; before it, {t.summary}",
                        details={**g.details, "thread_died": {
                            "thread": t.details["thread"], "summary": t.summary,
                            "callsites": t.callsites[:2]}},
                        callsites=[*g.callsites,
                                   *(c for c in t.callsites if c.get("rank") in g.ranks)])
            folded.append(t)
        out.append(g)
    return [f for f in out if not any(f is t for t in folded)]


def _keep_steps(crashes: list[Finding], from_log: list[Finding]) -> None:
    """A log's finding that replaced the exit-code crash of its one rank keeps the step
    that crash said: the output has the traceback, the log of ops the step."""
    for f in from_log:
        if len(f.ranks) != 1 or f.details.get("span"):
            continue
        span = next((c.details["span"] for c in crashes if c.details.get("source") != "log"
                     and c.ranks == f.ranks and c.details.get("span")
                     and c.details.get("incarnation") == f.details.get("incarnation")), None)
        if span:
            f.details["span"] = span
            f.summary += f"; rank {f.ranks[0]} was in {span}"


_OP_UNKNOWN = "after an op not known"
_AFTER_SOME_OP = ", after its ranks had run collectives, mid-run"


def _not_at_startup(crashes: list[Finding], startup: list[Finding]) -> None:
    """A log's "every rank failed at start-up" where the ranks' ops say they had run
    collectives: the failure came mid-run; said with the step the ranks were in."""
    for f in startup:
        ran = [c for c in crashes if c.details.get("source") != "log"
               and set(c.ranks) & set(f.ranks) and c.details.get("last_op") is not None]
        if ran:
            said_mid_run(f, ran[0].details["last_op"],
                         next((c.details["span"] for c in ran if c.details.get("span")), None),
                         [c for r in ran for c in r.callsites[:1]])


def said_mid_run(f: Finding, last: dict | None, span: str | None, callsites: list) -> None:
    """Reword a log's "every rank failed at start-up" whose ranks had completed `last`
    ({op, seq, group}) in `span`: it came mid-run. `last` None: after some op, which is
    not known yet (said so in details.mid_run, for the crashes that tell it later)."""
    f.details["family"] = "exceptions"
    f.summary = f.summary.replace(" failed at start-up with ", " raised ", 1).replace(
        _AFTER_SOME_OP, "", 1)
    if last is None:
        f.details["mid_run"] = _OP_UNKNOWN
        f.summary += _AFTER_SOME_OP
    else:
        f.details.pop("mid_run", None)
        f.summary += (f", after {last.get('op')} #{last.get('seq')} in group "
                      f"{last.get('group')} completed" + (f", in {span}" if span else "")
                      + ", mid-run")
    if span:
        f.details["span"] = span
    f.remedy = ("Every rank raised the same error mid-run: fix that one error (the "
                "traceback names its line).")
    if not f.callsites:
        f.callsites = callsites


def _ranks(ranks: list[int]) -> str:
    if len(ranks) > 4 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))
