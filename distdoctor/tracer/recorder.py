"""The rank-side recorder: turns a ProcessGroup call into one event-log record.

Hot-path rules (DESIGN principle 1): memory writes only, no collectives, no locks held
across a call, nothing raised into the caller (each entry point catches, warns once and
carries on); strings (groups, call sites, shapes) interned once.

Completion: a synchronous CPU op (torch.distributed's `async_op=False`, which waits on its
work right after the call) is waited on here, in the caller's thread. Works without a
future (gloo's send/recv and reduce-scatter, coalesced ops joined) complete when the
caller waits on them (work.py). Other CPU work
(async ops; C++ callers such as DDP's reducer) completes through its future's
done-callback, on gloo's thread, at the moment it finishes: the straggler detector reads
each rank's wait (end - enter) to the millisecond, and switching these callbacks off
measured no step-time gain (benchmarks/step_overhead.py). CUDA work, whose future
completes at enqueue, is looked at when the next op enters and by a coarse sweeper,
never in a tight poll (completion.py).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from functools import partial

from distdoctor.runlog import format as F
from distdoctor.runlog.ring import RingWriter
from distdoctor.runlog.slots import native_module
from distdoctor.tracer import callsite, exits, steps
from distdoctor.tracer.completion import PendingCompletions, StreamEnd
from distdoctor.tracer.opfields import FIELDS, fields_of, numel, reduce_op_number
from distdoctor.tracer.sites import CallSites
from distdoctor.tracer.support import warn_once
from distdoctor.tracer.work import DoneCallback, RecordingWork

EXIT_CALLBACK_WAIT_S = 0.5  # at exit, how long to let pending completion callbacks run
EXIT_WORK_GRACE_S = 0.02  # then, for their ops' works to be freed (close())


def _begin_failed(spec, exc: BaseException) -> None:
    warn_once("begin", f"could not record a {spec.op}: {exc!r}")


def _status_of(exc: BaseException) -> int:
    text = str(exc).lower()
    return F.STATUS_TIMEOUT if ("timed out" in text or "timeout" in text) else F.STATUS_ERROR


class Recorder:
    def __init__(self, ring: RingWriter):
        self.ring = ring
        self._interned: dict = {}  # (namespace, key) -> string id
        self.sites = CallSites(ring)  # the user's lines that issue ops (sites.py)
        # (shape, dtype, device) of one tensor, or a tuple of them -> string id
        self._tensor_ids: dict = {}
        self._futureless: set = set()  # op methods whose CPU works have no future
        self._spans: list[int] = []  # open spans (event numbers), innermost last
        self._pending = PendingCompletions(ring, self._finish)
        self.coalescing: dict[int, list[int]] = {}  # thread -> its open batch's ops
        self._main_thread = threading.main_thread().ident
        # the process whose log this is: a forked child (a data-loader worker, os.fork)
        # inherits this object, and its exit must not close the rank's log
        self._pid = os.getpid()
        self.on_heartbeat: list = []  # cheap checks to run once a second (never raising)
        self._stop = threading.Event()
        # one entry per async CPU op's done-callback that torch still holds: DoneCallback
        self._callbacks_alive: list = []
        self.exit_call = None  # a sys.exit call that may end the process (exits.py)
        self._use_native()
        threading.Thread(target=self._heartbeat, name="distdoctor-heartbeat",
                         daemon=True).start()
        self.steps = steps.StepMarker(self)
        steps.install_step_hooks()
        if steps.sample_hz() > 0:
            steps.Sampler(self, steps.sample_hz())
        atexit.register(self.close)

    def _use_native(self) -> None:
        """`begin` and `end` in C (runlog/_fast.c) where it was built, writing through the
        same slot writer: the same records, a few microseconds less per op. The methods
        below stay the reference, and the path for everything the C code hands back."""
        native = native_module()
        if native is None or not isinstance(getattr(self.ring, "_slots", None),
                                            native.SlotWriter):
            return
        try:
            core = native.Core(
                slots=self.ring._slots, recorder=self, pending=self._pending,
                spans=self._spans, callsites={}, tensor_ids=self._tensor_ids,
                internal=callsite._internal, fields=FIELDS,
                is_internal=callsite._is_internal, fields_of=fields_of,
                redop_reader=None if reduce_op_number is hash else reduce_op_number,
                tensors_miss=self._tensors_id, callsite_miss=self.sites.at,
                off_main=self.sites.off_main, on_error=_begin_failed,
                end_other=partial(Recorder.end, self), finish=self._finish,
                work_class=RecordingWork, main_ident=self._main_thread,
                constants={name: getattr(F, name) for name in (
                    "KIND_P2P", "REDOP_NONE", "FLAG_ASYNC", "FLAG_ASYNC_UNKNOWN",
                    "FLAG_OTHER_THREAD", "STATUS_OK")})
        except Exception as exc:
            warn_once("native", f"the C hot path could not start: {exc!r}")
            return
        self.begin, self.end = core.begin, core.end
        self._core = core  # the traced methods' C path records through it (_fast.c)

    # --- interning -------------------------------------------------------------------
    def intern(self, namespace: str, key, value) -> int:
        k = (namespace, key)
        sid = self._interned.get(k)
        if sid is None:
            sid = self.ring.add_string(value() if callable(value) else value)
            if sid:
                self._interned[k] = sid
        return sid

    def _tensors_id(self, tensors) -> int:
        if not tensors:
            return 0
        # torch.Size hashes as a tuple; one tensor (the common case) skips the generator
        if len(tensors) == 1:
            t = tensors[0]
            key = (t.shape, t.dtype, t.device)
            each = (key,)
        else:
            key = each = tuple((t.shape, t.dtype, t.device) for t in tensors)
        sid = self._tensor_ids.get(key)
        if sid is None:
            sid = self.ring.add_string({
                "shapes": [list(s) for s, _, _ in each],
                "dtypes": [str(d).replace("torch.", "") for _, d, _ in each],
                "device": str(each[0][2]),
            })
            if sid:
                self._tensor_ids[key] = sid
        return sid

    # --- ops -------------------------------------------------------------------------
    def begin(self, pg, spec, desc):
        """Record an op entering; returns a token for `end`, or None (not recorded).

        `desc` is `spec.describe(...)` of the call: (inputs, outputs, options, peer).
        """
        try:
            if self._pending._pending:  # earlier ops' completions, seen on the way in
                self._pending.check()
            ins, outs, opts, peer = desc
            t_enter = time.monotonic_ns()
            group_id = pg._dd_group_id or pg._dd_describe(self)
            if spec.kind == F.KIND_P2P:
                key = (spec.op, peer)
                seq = pg._dd_p2p_seq.get(key, 0)
                pg._dd_p2p_seq[key] = seq + 1
            else:
                seq = pg._dd_seq
                pg._dd_seq = seq + 1
            redop, flags = F.REDOP_NONE, 0
            if opts is not None:
                has_redop, has_root, has_async = fields_of(type(opts))
                if has_redop:
                    redop = reduce_op_number(opts.reduceOp)
                if has_root:
                    peer = opts.rootRank
                if not has_async:  # torch 2.6 and older: no async flag in options
                    flags |= F.FLAG_ASYNC | F.FLAG_ASYNC_UNKNOWN
                elif opts.asyncOp:
                    flags |= F.FLAG_ASYNC
            else:
                flags |= F.FLAG_ASYNC_UNKNOWN
            tensors = ins or outs
            tensors_id = self._tensors_id(tensors)
            callsite_id, from_main = self.sites.current()
            if from_main or threading.get_ident() != self._main_thread:
                flags |= F.FLAG_OTHER_THREAD
            numel_in = numel(ins)
            numel_out = numel_in if outs is ins else numel(outs)
            e = self.ring.append(
                spec.kind, spec.code, redop, flags, group_id, callsite_id, seq,
                -1 if peer is None else int(peer), tensors_id, numel_in, numel_out, t_enter,
                self._spans[-1] + 1 if self._spans else 0, 0,
            )
            return (e, bool(tensors) and tensors[0].is_cuda, bool(flags & F.FLAG_ASYNC)
                    or opts is None, spec.method)
        except Exception as exc:  # never into user code
            _begin_failed(spec, exc)
            return None

    def end(self, token, work):
        """The op's call returned `work`; arrange for its completion to be recorded.

        Returns the work to hand to the caller: `work` itself, or for CPU work that has no
        future (gloo's send/recv) a wrapper that records completion when waited on. A
        synchronous CPU op is waited on here; its error, if any, is raised from here.
        """
        if token is None:
            return work
        e, on_cuda, async_op, method = token
        if work is not None and not on_cuda and not async_op:
            return self._wait_sync(e, work)
        try:
            if work is None and on_cuda and self.coalescing and (
                    batch := self.coalescing.get(threading.get_ident())) is not None:
                batch.append(e)  # an op of a coalesced batch (exact_class.py)
            elif work is None:  # synchronous ops (monitored_barrier) return nothing; so
                # does a synchronous NCCL op on torch >= 2.8, queued, not done
                end = StreamEnd.now() if on_cuda else None
                if end is not None:
                    self._pending.add_work(e, end)
                else:
                    self.ring.complete(e, F.STATUS_OK, time.monotonic_ns())
            elif on_cuda:
                self._pending.add_work(e, work)
            elif method in self._futureless:
                return RecordingWork(work, partial(self._finish_wait, e))
            else:
                try:
                    fut = work.get_future()
                except RuntimeError:  # "getFuture not implemented": gloo's p2p and
                    # _reduce_scatter_base works, coalesced ops joined. is_completed() of
                    # these stays False even once waited on, so the wait is the
                    # completion. Asked once per method: the C++ exception costs ~8 us.
                    self._futureless.add(method)
                    return RecordingWork(work, partial(self._finish_wait, e))
                fut.add_done_callback(DoneCallback(self._future_done, e,
                                                   self._callbacks_alive))
        except Exception as exc:
            warn_once("end", f"could not follow an op's completion: {exc!r}")
        return work

    def _wait_sync(self, e: int, work):
        """A synchronous CPU op (`async_op=False`): torch.distributed waits on its work the
        moment the call returns, so waiting here, in the same thread, changes nothing for
        the caller (its own wait then returns at once, and an error is raised from the
        same `torch.distributed` call) and times the completion with no extra object per
        op. A done-callback instead would run on gloo's thread and take the GIL from this
        one: ~70 us a call in GIL hand-offs (benchmarks/tracer_overhead.py)."""
        try:
            work.wait()
        except BaseException as exc:
            self._finish(e, exc)
            raise
        try:
            self.ring.complete(e, F.STATUS_OK, time.monotonic_ns())
        except Exception as exc:
            warn_once("end", f"could not record a completion: {exc!r}")
        # freed here, with the GIL, when the next op completes: see RecordingWork
        RecordingWork._last_waited = work
        return work

    def _finish_wait(self, e: int, exc: BaseException | None) -> None:
        if exc is None:
            self.ring.complete(e, F.STATUS_OK, time.monotonic_ns())
        else:
            self._finish(e, exc)

    def fail(self, token, exc: BaseException) -> None:
        """The op's call raised (bad arguments, a dead peer): record why."""
        if token is not None:
            self._finish(token[0], exc)

    def _future_done(self, e: int, fut) -> None:
        try:
            fut.value()
            self.ring.complete(e, F.STATUS_OK, time.monotonic_ns())
        except Exception as exc:
            self._finish(e, exc)

    def _finish(self, e: int, exc: BaseException) -> None:
        """Event e ended with `exc`: an error, or a timeout when the message says so."""
        try:
            error_id = self.ring.add_string(str(exc)[:2000])
            self.ring.complete(e, _status_of(exc), time.monotonic_ns(), error_id)
        except Exception as err:
            warn_once("finish", f"could not record a completion: {err!r}")

    # --- spans -----------------------------------------------------------------------
    def span_begin(self, name: str, seq: int = 0, flags: int = 0):
        try:
            name_id = self.intern("span", name, name)
            callsite_id, _ = self.sites.current()
            e = self.ring.append(F.KIND_SPAN, F.OP_CODE["span"], F.REDOP_NONE, flags, 0,
                                 callsite_id, seq, -1, 0, 0, 0, time.monotonic_ns(),
                                 self._spans[-1] + 1 if self._spans else 0, name_id)
            self._spans.append(e)
            return e
        except Exception as exc:
            warn_once("span", f"could not record span {name!r}: {exc!r}")
            return None

    def sample(self, frame, t_ns: int, runq_us: int = 0) -> None:
        """The main thread was at `frame` (a user frame, outside ops) at `t_ns`, and had
        waited `runq_us` for a CPU since the previous sample (in the numel_in word)."""
        site = self.sites.of(frame, False, 0)
        spans = self._spans
        e = self.ring.append(F.KIND_SAMPLE, F.OP_CODE["sample"], F.REDOP_NONE, 0, 0, site,
                             0, -1, 0, runq_us, 0, t_ns, spans[-1] + 1 if spans else 0, 0)
        self.ring.complete(e, F.STATUS_OK, t_ns)

    def span_end(self, e: int, failed: bool = False) -> None:
        try:
            if e in self._spans:
                self._spans.remove(e)
            self.ring.complete(e, F.STATUS_ERROR if failed else F.STATUS_OK,
                               time.monotonic_ns())
        except Exception as exc:
            warn_once("span", f"could not close a span: {exc!r}")

    # --- liveness --------------------------------------------------------------------
    def _heartbeat(self) -> None:
        """Once a second (or when a writer nears the end of the disk space reserved for
        the log): the heartbeat, and space reserved ahead of the writers."""
        full = False
        while not self._stop.is_set():
            self.ring.wake.wait(1.0)
            if self._stop.is_set():
                return
            try:
                self.ring.heartbeat()
                for check in self.on_heartbeat:
                    check()
                if not self.ring.reserve_ahead() and not full:
                    full = True
                    print("distdoctor: the disk under the run dir is full: this rank's "
                          "events are not recorded until there is room (the job goes on)",
                          file=sys.stderr)
            except Exception:
                return

    def raised(self, exc_type, exc, tb) -> None:
        """The main thread is ending on an uncaught exception (from sys.excepthook): the
        log says so, so a reader tells a rank that failed from one that finished."""
        if os.getpid() != self._pid:
            return
        try:
            self.ring.mark_closed(self.ring.add_string({
                "type": getattr(exc_type, "__name__", str(exc_type)),
                "message": str(exc)[:1000], **callsite.raise_site(tb)}))
        except Exception:
            pass

    def retire(self) -> None:
        """This rank made a new default group (a new incarnation, a new log): this log is
        finished. Late completions of its ops may still land in it. Not in a forked
        child: the parent's threads may have held these events' locks at the fork."""
        if os.getpid() != self._pid:
            return
        self._stop.set()
        self.ring.wake.set()
        try:
            self.ring.heartbeat()
            self.ring.mark_closed()
        except Exception:
            pass

    def exiting(self, status, call: dict | None = None) -> None:
        """os._exit(status) is ending the process: exit hooks will not run, so the log
        takes the status now (a reader then knows a rank that left from one that died),
        and the call's line (exits.py)."""
        if os.getpid() != self._pid:
            return
        try:
            self._stop.set()
            self._pending.close()
            self.ring.heartbeat()
            self.ring.mark_exited(int(status) & 0xFF, self.ring.add_string(call) if call else 0)
        except Exception:
            pass

    def close(self) -> None:
        """At exit. The log is marked closed first: a launcher that kills this process
        while it finishes must still find an exit, not a rank that vanished."""
        exits.write_exit_call(self)  # a sys.exit that ends it: its status and line
        self.retire()
        if os.getpid() != self._pid:
            return
        self._pending.close()  # the CUDA ops that are done by now are recorded as done
        # Let completion callbacks still held on gloo's threads run and be freed now (work.py)
        if not self._callbacks_alive:
            return
        deadline = time.monotonic() + EXIT_CALLBACK_WAIT_S
        while self._callbacks_alive and time.monotonic() < deadline:
            time.sleep(0.002)  # releases the GIL to them
        # The thread that freed the last one goes on to free that op's work, which takes
        # the GIL too when the work's thread-local state holds a Python object: during
        # backward torch's autograd keeps a contextvars.Context there (autograd/graph.py,
        # torch 2.13), so every DDP all-reduce work does (a second core dump: ~AsyncWork
        # on pt_gloo_runloop). It does so microseconds later. Bare jobs race for it alike
        # (torch's own), but an exit that just waited here must not start the race.
        time.sleep(EXIT_WORK_GRACE_S)
