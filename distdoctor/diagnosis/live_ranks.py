"""The live diagnosis' watch on its ranks (a mixin of LiveDiagnosis, live.py, which holds
the state it reads: the follower, this host's name, the owner's progress reader): each
rank's heartbeat and whether it is alive, the evidence of progress of the local ranks
others wait for, and the stacks a hang finding carries.
"""

from __future__ import annotations

from distdoctor.diagnosis.crashes.crash import ExitInfo
from distdoctor.diagnosis.engine.core import Engine
from distdoctor.diagnosis.pids import pid_alive

STALE_HEARTBEAT_S = 10.0  # a remote rank whose heartbeat stopped this long has died
LOCAL_STALE_S = 3.0  # a viewer's confirmation that a local rank whose pid is gone died
REVIVED_HB_S = 0.5  # a heartbeat this fresh (two of the follower's polls): the rank lives


class RankWatch:
    def _check_ranks(self, now_s: float) -> None:
        """Each rank's heartbeat (as of the last poll), and whether it is still alive."""
        for i in list(self.engines):
            if i in self._done:
                continue
            engine, meta = self.engines[i], self.follower.meta_of(i)
            for rank, header in self.follower.headers(i).items():
                engine.heartbeat(rank, header.heartbeat_mono_ns, now_s)
                self._check_alive(engine, meta.get(rank) or {}, rank, header, now_s)

    def _check_alive(self, engine: Engine, meta: dict, rank: int, header,
                     now_s: float) -> None:
        """Without a launcher that reports exits: a closed log means the rank shut down; a
        pid gone from this host without a closed log means it died; a rank on another
        host whose heartbeat is stale for a while is unheard (dead, or its node or link
        down)."""
        st = engine.ranks.get(rank)
        if st is None:
            return
        if st.exit is not None:
            # a remote rank taken for dead whose heartbeat came back: the link to its node
            # (a collector's) or the shared file system had stalled, the rank had not died
            if (st.exit.how in ("vanished", "unheard") and rank not in engine.same_clock
                    and (engine.heartbeat_age_s(rank, now_s) or 0.0) < REVIVED_HB_S):
                engine.revive(rank)
            return
        if header.closed:
            engine.exited(rank, ExitInfo.of_closed_log(header))
            return
        local = meta.get("host") == self.host
        if local:
            engine.same_clock.add(rank)  # one clock: the heartbeat's age is exact
        hb_age_s = engine.heartbeat_age_s(rank, now_s) or 0.0
        if local:
            # A viewer may sit in another pid namespace on the same host (a sidecar
            # container): there every pid looks gone, so it also wants the heartbeat stopped.
            if not pid_alive(meta.get("pid")) and (self.owner or hb_age_s > LOCAL_STALE_S):
                engine.exited(rank, ExitInfo(None, "vanished"))
        elif hb_age_s > STALE_HEARTBEAT_S:
            # another host's rank: its pid cannot be looked at from here
            engine.exited(rank, ExitInfo(None, "unheard"))

    def _running(self) -> list[tuple[int, Engine]]:
        """(incarnation, engine) of those not left as they are (live.py's `_done`), oldest
        first. Incarnations may run side by side: a rank's helper that makes a process
        group of its own is traced as a newer one while the job's ranks still run."""
        return [(i, e) for i, e in sorted(list(self.engines.items())) if i not in self._done]

    def running_engines(self) -> list[Engine]:
        """Their engines: where `run --on-hang kill` looks for a hang."""
        return [e for _, e in self._running()]

    def _read_progress(self, newest: Engine) -> None:
        """Evidence of progress of the local ranks that others may be waiting for, in
        every incarnation still running: with only the newest's read, a job whose rank
        had started a helper group was never judged hung (its rank's last reading stood
        for good). `newest`: the newest incarnation's engine, of which a node sending
        digests watches every local rank."""
        if self._progress is None:
            return
        newest.watch_all_progress = self.on_batch is not None
        engines, pids = {}, {}
        for i, engine in self._running():
            wanted = engine.wanted_progress()
            if wanted:
                engines[i] = engine
                pids.update({(i, r): p for r, p in self._local_pids(i).items()
                             if r in wanted})
        for (i, rank), reading in self._progress.read(pids).items():
            engines[i].progress.add(rank, reading)

    def _local_pids(self, incarnation: int | None = None) -> dict[int, int]:
        """This node's rank pids in `incarnation` (default: the newest, for the per-node
        sampler)."""
        out = {}
        if incarnation is None:
            incarnation = self.follower.newest
        for rank, meta in self.follower.meta_of(incarnation).items():
            if meta.get("host") == self.host and isinstance(meta.get("pid"), int):
                out[rank] = meta["pid"]
        return out

    def _dump_stacks(self, incarnation: int, ranks: list[int]) -> dict[int, str]:
        if self.stacks_mode == "none":
            return {}
        meta = self.follower.meta_of(incarnation)
        wanted = sorted(meta) if self.stacks_mode == "all" else ranks
        pids = {r: (meta.get(r) or {}).get("pid") for r in wanted}
        pids = {r: p for r, p in pids.items() if isinstance(p, int)
                and (meta.get(r) or {}).get("host") == self.host}
        if not pids:
            return {}
        try:
            from distdoctor.probes.stacks import dump_stacks
        except ImportError:
            return {}
        dumps = dump_stacks(pids)
        return {r: f"[{d.method}]\n{d.text or d.error or ''}" for r, d in dumps.items()}

