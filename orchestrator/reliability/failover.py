"""Orchestrator fail-over: persist what resuming takes, renew ownership, adopt the orphaned.

Every replica runs one loop (every `renew_s`): renew the leases of its pipelines (a lost CAS
means another replica took one over: drop it and stop acting on it), notice a reconnect to
NATS (then catch up on task events from the `MARS_EVENTS` stream it may have missed while
away), and adopt pipelines whose owner stopped renewing. Adopting = take the lease by CAS
(exactly one replica wins), rebuild the run from `MARS_RUNS`, replay the pipeline's task events
from the stream through the normal event path (event ids and fencing tokens make replay
idempotent), re-place unfinished tasks whose agents are gone, and carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import KeyWrongLastSequenceError

from orchestrator.infra.eventloop import Pacer
from orchestrator.reliability.ownership import (
    Leases,
    LeaseTaken,
    RunStore,
    from_record,
    record_fields,
)
from orchestrator.reservations.store import device_key_of
from orchestrator.state import lifecycle
from orchestrator.state.pipelines import PipelineRun
from schemas import subjects
from schemas.api import (
    TASK_ENDED_STATES,
    TERMINAL_STATES,
    StatusReply,
    StatusRequest,
    SubmitReply,
)
from schemas.errors import ServiceError
from schemas.failover import spec_key
from schemas.pipeline import PipelineSpec

if TYPE_CHECKING:
    from orchestrator.ports import FailoverDoor

log = logging.getLogger("mars.failover")
#: A record write that loses its CAS is read back and tried again this many times in all.
RECORD_CAS_TRIES = 3
#: Ownership lease, its renewal cadence, and the margin either side of expiry for clock skew.
OWNER_LEASE_S = 3.0
OWNER_RENEW_S = 1.0
OWNER_GRACE_S = 0.5
#: Back from an outage of its own, a replica adopts no lease for this many lease lengths:
#: every lease may have lapsed meanwhile with its owner alive and about to renew it (a 15 s
#: server restart made both replicas adopt each other's pipelines).
ADOPT_HOLD_LEASES = 2.0
REPLAY_BATCH = 256
FINISHED_KEPT = 10_000
#: A new pipeline's spec write that failed is tried again this many times, after waits of
#: SPEC_RETRY_S, twice that, ..., before its submit is answered `unavailable` instead.
SPEC_RETRIES = 3
SPEC_RETRY_S = 0.2
#: Shortest interval between two progress writes of one pipeline's record.
PROGRESS_EVERY_S = 0.25
#: Attempts at writing a pipeline's record before giving up (about a minute of backoff).
PERSIST_RETRIES = 40
#: A live pipeline's spec, record and result chunks are written again once this share of
#: `Orchestrator.keep_s` has passed since they last were (they expire at keep_s) ...
KEEP_FRESH_SHARE = 1 / 3
#: ... looked for this often (or more often under a short `--keep-hours`: `keep_fresh_every`).
KEEP_FRESH_CHECK_S = 60.0
#: Dead owners remembered as swept (`Failover._give_back_ended`), at most.
MAX_SWEPT = 256


class Failover:
    def __init__(
        self,
        orch: FailoverDoor,
        *,
        lease_s: float = OWNER_LEASE_S,
        renew_s: float = OWNER_RENEW_S,
        grace_s: float = OWNER_GRACE_S,
    ) -> None:
        if not 0 < renew_s < lease_s - grace_s:
            raise ValueError("need 0 < renew_s < lease_s - grace_s")
        self.o = orch
        self.lease_s, self.renew_s, self.grace_s = lease_s, renew_s, grace_s
        self.leases: Leases = None  # type: ignore[assignment]  # set in start()
        self.runs: RunStore = None  # type: ignore[assignment]
        #: Per pipeline: record revision we wrote, events known applied, adoptions so far.
        self._rev: dict[str, int] = {}
        self._seq: dict[str, int] = {}
        self._adoptions: dict[str, int] = {}
        self._spec_saved: set[str] = set()
        #: A new pipeline's spec write, begun as its claim is won and awaited before its
        #: reply (`save_spec`, `spec_saved`).
        self._spec_writes: dict[str, asyncio.Future[None]] = {}
        #: Pipelines adopted with no record: placed anew (answered, never recorded) or their
        #: id freed (never answered).
        self.placed_anew = 0
        self.freed = 0
        #: Per live pipeline held here: when its spec, record and result chunks were last all
        #: written (monotonic), for `keep_fresh`.
        self._written: dict[str, float] = {}
        #: A live pipeline's keys are written again once this old (`keep_fresh`) ...
        self.refresh_s = KEEP_FRESH_SHARE * orch.keep_s
        #: ... or sooner when their buckets keep keys for less than this replica's keep_s
        #: (another replica started with a shorter `--keep-hours` sets their max age): the
        #: shortest max age `keep_fresh` last read, None before.
        self.buckets_keep_s: float | None = None
        self.keep_fresh_check_s = KEEP_FRESH_CHECK_S
        self._kept_fresh_at = -math.inf
        self._keeping: asyncio.Task[Any] | None = None
        #: Pipelines whose keys `keep_fresh` wrote again.
        self.kept_fresh = 0
        self._locks: dict[str, asyncio.Lock] = {}
        self._want: dict[str, int] = {}
        self._retries: dict[str, int] = {}
        self._done: dict[str, int] = {}
        self._adopting: set[str] = set()
        #: No adoption before this (monotonic): set when this replica is back from an outage
        #: of its own, during which every lease may have lapsed with its owner alive...
        self._adopt_from = -math.inf
        #: ... but one lapsed (expiry and grace) before this instant (booking clock), the last
        #: this replica saw the server up before the outage, lapsed while its owner could
        #: renew it: adopted at once, as it would have been without the outage.
        self._lapsed_before = -math.inf
        #: ... and one renewed (or claimed) after this instant (booking clock), when this
        #: replica noticed it was back, lapsed with the server up: its expiry is at least a
        #: lease length later. (A renewal sent while its owner was away waits in the owner's
        #: client and may be stored after this, with an expiry from before: still held.)
        self._back_at = -math.inf
        self._progress_due: set[str] = set()
        #: Recently finished here (insertion-ordered, bounded): late persists are no-ops.
        self._finished: dict[str, None] = {}
        #: Ended pipelines whose end is told (their terminal event) once their record says so.
        self._tell_when_recorded: dict[str, PipelineRun] = {}
        self._loop: asyncio.Task[Any] | None = None
        self.adopted = 0
        #: Dead owners whose ended pipelines' windows were looked for (`_give_back_ended`).
        self._swept: dict[str, None] = {}
        self.lost = 0
        self.fenced_writes = 0
        #: Resumable records written (the progress ones rate-limited per pipeline).
        self.record_writes = 0
        self.replayed = 0

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        o = self.o
        self.leases = Leases(
            o.js, o.owner, lease_s=self.lease_s, grace_s=self.grace_s, mono=o.mono,
            wall=o.wall, keep_s=o.keep_s,
            connection=lambda: o.nc.stats["reconnects"] if o.nc is not None else -1,
        )  # fmt: skip
        self.runs = RunStore(o.js, o.keep_s)
        await self.leases.start()
        await self.runs.start()

    async def stop(self) -> None:
        if self.leases is not None:
            await self.leases.stop()

    # -- ownership ------------------------------------------------------------------------------
    def end_recorded(self, pid: str) -> bool:
        """A pipeline's record says it ended (or there are no records to say so)."""
        return self.leases is None or pid in self._finished

    def holds(self, pid: str) -> bool:
        """This replica holds the pipeline's lease (lapsed or not): a pipeline whose end is
        recorded gives it back."""
        return self.leases is not None and pid in self.leases.held

    def tell_when_recorded(self, run: PipelineRun) -> None:
        """Publish this ended pipeline's terminal event once its record says it ended (its
        write failed, or its lease had lapsed): whoever hears of the end finds it in `status`
        on any replica. Lost to another replica meanwhile, its adopter tells it."""
        self._tell_when_recorded[run.pipeline_id] = run

    def may_act(self, pid: str) -> bool:
        """The fence: act on a pipeline only while holding its lease."""
        return self.leases is not None and self.leases.may_act(pid)

    async def claim(self, pid: str, spec: PipelineSpec) -> SubmitReply | None:
        """Own a new pipeline (None), or answer a re-submit of an id someone else owns."""
        try:
            await self.leases.claim(pid)
            return None
        except LeaseTaken as taken:
            owner = taken.lease.owner if taken.lease else "another replica"
        except Exception as exc:
            raise ServiceError("unavailable", f"cannot claim pipeline {pid}: {exc}") from exc
        known = await self.runs.spec(pid)
        if known is not None and known != spec:
            raise ServiceError("conflict", f"pipeline id {pid} exists with another spec")
        try:
            st = await self.o.queries.status(StatusRequest(pipeline_id=pid))
        except ServiceError as exc:
            raise ServiceError("conflict", f"pipeline {pid} is being placed by {owner}") from exc
        if st.state == "placing":
            # a submit's answer is a committed plan, and nothing is committed yet: a
            # placement NATS fails part-way is given up with nothing kept (and published:
            # nobody was told of it), and a client told "placing" would wait for its end for
            # ever. Asked again, it gets the outcome
            raise ServiceError(
                "conflict", f"pipeline {pid} is being placed by {st.owner or owner}; ask again"
            )
        return SubmitReply(
            pipeline_id=pid,
            state=st.state,
            algorithm=st.algorithm,
            makespan_s=st.planned_makespan_s,
            plan=st.plan,
            cost=st.planned_cost,
        )

    # -- persistence ----------------------------------------------------------------------------
    def save_spec(self, run: PipelineRun) -> None:
        """Begin writing a new pipeline's spec, now its claim is ours: it is on the bucket
        before the submit is answered (`spec_saved`), so a replica adopting the pipeline
        before its first record knows it was answered and what to place (`_adopt`)."""
        pid = run.pipeline_id
        if pid not in self._spec_saved and pid not in self._spec_writes:
            self._spec_writes[pid] = asyncio.ensure_future(self._save_spec(run))

    async def _save_spec(self, run: PipelineRun) -> None:
        pid = run.pipeline_id
        try:
            await self.runs.save_spec(pid, run.spec)
        except Exception as exc:  # tried again before the submit is answered (`spec_written`)
            log.warning("writing the spec of %s failed: %r", pid, exc)
            return
        self._spec_written(pid)

    def _spec_written(self, pid: str) -> None:
        self._spec_saved.add(pid)
        self._written[pid] = self.o.mono()

    async def spec_saved(self, pid: str) -> None:
        """The spec write `save_spec` began has ended (written, or left to the record's)."""
        write = self._spec_writes.pop(pid, None)
        if write is not None:
            await write

    async def spec_written(self, run: PipelineRun) -> bool:
        """Whether the pipeline's spec is on the bucket, the write `save_spec` began tried
        again (SPEC_RETRIES times) when it failed: a submit is answered only once it is,
        or a replica that adopts the pipeline before its first record finds neither spec
        nor record, frees the id, and the pipeline its client was told is placed is gone."""
        pid = run.pipeline_id
        await self.spec_saved(pid)
        for attempt in range(SPEC_RETRIES):
            if pid in self._spec_saved:
                return True
            await asyncio.sleep(SPEC_RETRY_S * (attempt + 1))  # back off, write again
            await self._save_spec(run)
        return pid in self._spec_saved

    async def forget_unplaced(self, pid: str) -> None:
        """A new pipeline refused before anything was booked or offered, its id left free:
        its spec is deleted, then its lease (a submit that claims the id next writes its
        own spec, which may differ)."""
        await self.spec_saved(pid)
        self._forget(pid)
        with contextlib.suppress(Exception):
            await self.runs.kv.delete(spec_key(pid))
        await self.leases.free(pid)

    def let_go(self, pid: str) -> None:
        """Hold a pipeline's lease no more, and write nothing of it: it lapses, and the
        pipeline is adopted as its record and spec say."""
        self.leases.held.pop(pid, None)
        self._tell_when_recorded.pop(pid, None)
        self._forget(pid)

    def progress(self, run: PipelineRun) -> None:
        """A finished task: persist the record at most once per PROGRESS_EVERY_S per pipeline.

        The record only speeds up resuming: an adopting replica replays every task event of
        the pipeline from MARS_EVENTS after the record's `events_seq`, so a record a few
        finished tasks behind loses nothing, and a 20-task pipeline of short tasks costs one
        progress write instead of twenty.
        """
        pid = run.pipeline_id
        if pid in self._progress_due:
            return
        self._progress_due.add(pid)
        self.o.spawn(self._progress_later(run))

    async def _progress_later(self, run: PipelineRun) -> None:
        try:
            await asyncio.sleep(PROGRESS_EVERY_S)  # a rate limit, not synchronisation
        finally:
            self._progress_due.discard(run.pipeline_id)
        if not run.terminal:  # the terminal state is persisted on its own path
            await self.persist(run)

    async def persist(self, run: PipelineRun) -> None:
        """Status for `status`, and the resumable record by CAS under our epoch. Calls that
        queue behind a write which already covered them return at once."""
        pid = run.pipeline_id
        if not self.may_act(pid):
            if not (run.terminal and pid in self._finished):
                self.fenced_writes += 1
                log.debug("not persisting %s: lease not held", pid)
            return
        ticket = self._want[pid] = self._want.get(pid, 0) + 1
        lock = self._locks.setdefault(pid, asyncio.Lock())
        failed = False
        async with lock:
            if self._done.get(pid, 0) >= ticket:
                return
            before = self._done.get(pid, 0)
            self._done[pid] = self._want.get(pid, ticket)
            try:
                await self._write(run)
                self._retries.pop(pid, None)
            except Exception as exc:
                log.warning("persisting %s failed (will retry): %s", pid, exc)
                self._done[pid] = before  # nothing was covered: the retry writes it all
                failed = True
        if failed:
            self.o.spawn(self._persist_later(run))
        elif pid in self._finished and self._locks.get(pid) is lock and not lock.locked():
            del self._locks[pid]

    async def status_elsewhere(self, pid: str) -> StatusReply | None:
        """The status of a pipeline this replica does not hold, as its owner last recorded it
        (the record is what an adopter resumes from, so it is never older than a status
        written beside it would be); None when there is no record."""
        rec, spec = await asyncio.gather(self.runs.record(pid), self.runs.spec(pid))
        if rec is None or spec is None:
            return None
        o = self.o
        run = from_record(rec[0], spec, owner=rec[0].owner, mono=o.mono(), wall=o.wall())
        return run.status(o.mono())

    async def lapsed_elsewhere(self, pid: str) -> bool:
        """Whether a pipeline nobody holds now exists all the same: its lease lapsed and not
        given up (its owner cut off or dead, an adopter not there yet), or its spec written
        (answered) before any record. A status or cancel of it then says "ask again", not
        "no such pipeline": a client told `not_found` of a live pipeline would give up on it
        while it runs to its end (the server down longer than a lease, say)."""
        got, spec = await asyncio.gather(self.leases.read(pid), self.runs.spec(pid))
        return spec is not None or (got is not None and got[0].expires > 0.0)

    async def holder(self, pid: str) -> str | None:
        """The replica holding a pipeline's ownership lease now (None: nobody does)."""
        got = await self.leases.read(pid)
        if got is None:
            return None
        lease, _rev = got
        return lease.owner if lease.expires > self.o.wall() else None

    async def _persist_later(self, run: PipelineRun) -> None:
        """A write that failed (NATS or JetStream unavailable for a moment, e.g. a server
        restart) is retried with a growing delay: the record is what fail-over resumes from."""
        pid = run.pipeline_id
        n = self._retries[pid] = self._retries.get(pid, 0) + 1
        if n > PERSIST_RETRIES:
            log.error("giving up persisting %s after %d attempts", pid, n - 1)
            self._retries.pop(pid, None)
            told = self._tell_when_recorded.pop(pid, None)
            if told is not None:  # told unrecorded rather than never
                self.o.spawn(self.o.publish_pipeline(told, recorded=False))
            return
        await asyncio.sleep(min(0.2 * n, 2.0))  # back off before the next attempt
        await self.persist(run)

    async def _write(self, run: PipelineRun) -> None:
        pid, o = run.pipeline_id, self.o
        if pid in self._finished:
            return  # its final state is written already
        if pid not in self._spec_saved:
            await self.runs.save_spec(pid, run.spec)
            self._spec_written(pid)
        for _ in range(RECORD_CAS_TRIES):
            if not self.may_act(pid):
                self.fenced_writes += 1
                log.debug("not persisting %s: lease lapsed while writing", pid)
                return
            epoch = self.leases.epoch(pid)
            # what this write says: the pipeline may end while it is on its way, and then the
            # ending is written by the persist queued behind it, not taken as written
            ended = run.terminal
            rec = record_fields(
                run,
                epoch=epoch,
                events_seq=self._seq.get(pid, 0),
                adoptions=self._adoptions.get(pid, 0),
                mono=o.mono(),
                wall=o.wall(),
            )
            try:
                self._rev[pid] = await self.runs.write(rec, self._rev.get(pid))
                self.record_writes += 1
                break
            except KeyWrongLastSequenceError:
                cur = await self.runs.record(pid)
                if cur is not None and cur[0].epoch > epoch:
                    self._lose(pid, f"record written under epoch {cur[0].epoch}")
                    return
                if cur is not None:
                    self._rev[pid] = cur[1]  # an earlier life of ours wrote it: take it over
        else:  # said by `persist`, which tries again later: a record is never dropped silently
            raise RuntimeError(f"record of {pid}: lost the CAS {RECORD_CAS_TRIES} times")
        if ended:
            await self.leases.release(pid)
            self._finished[pid] = None
            while len(self._finished) > FINISHED_KEPT:
                self._finished.pop(next(iter(self._finished)))
            told = self._tell_when_recorded.pop(pid, None)
            if told is not None:
                o.spawn(o.publish_pipeline(told))
            self._forget(pid)

    def _forget(self, pid: str) -> None:
        """A finished pipeline needs no bookkeeping here any more (its lock stays while
        someone waits on it)."""
        for d in (self._want, self._done, self._rev, self._seq, self._adoptions, self._written):
            d.pop(pid, None)
        self._spec_saved.discard(pid)
        # notices kept while its lease had lapsed: ended, or its new owner hears what comes
        self.o.displaced.drop_parked(pid)

    def _lose(self, pid: str, why: str) -> None:
        """Another replica owns this pipeline now: forget it here, act on it no more."""
        self.lost += 1
        self.let_go(pid)
        run = self.o.pipelines.pop(pid, None)
        log.warning("lost pipeline %s to another replica (%s); no longer acting on it", pid, why)
        if run is not None:
            lost = lifecycle.LeaseLost(self.o.owner, why, pid in self._finished)
            for e in lifecycle.step(run, lost, self.o.mono()):
                if isinstance(e, lifecycle.PassCancel):
                    self.o.spawn(self.o.queries.cancel_lost(run))

    # -- the loop -------------------------------------------------------------------------------
    async def run(self) -> None:
        """Renew, catch up after reconnects, adopt; one pass every `renew_s`."""
        self._loop = asyncio.current_task()
        nc = self.o.nc
        assert nc is not None
        reconnects = nc.stats["reconnects"]
        while True:
            await asyncio.sleep(self.renew_s)  # renewal cadence, not synchronisation
            try:
                lost, resumed = await self.leases.renew_all()
                if not self.leases.held and nc.is_connected:
                    # renewals are this replica's sign the server was up before an outage
                    # (`_lapsed_before`); holding none, it asks for one
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(self.renew_s):
                            await self.leases.confirm_up()
                for pid in lost:
                    self._lose(pid, "renewal lost the CAS race")
                catch_up = set(resumed)
                if nc.stats["reconnects"] != reconnects:
                    self._lapsed_before = self.leases.up_at.get(reconnects, -math.inf)
                    reconnects = nc.stats["reconnects"]
                    catch_up |= set(self.leases.held)
                    self._back_at = self.o.wall()
                    await self.leases.watch()
                    # a lease that expired while we were away (the server restarting, say)
                    # says nothing of its owner, away too: owners get ADOPT_HOLD_LEASES leases'
                    # time to renew their own before anyone's is adopted here (but one that
                    # lapsed before, or was renewed after this, lapsed with the server up)
                    self._adopt_from = self.o.mono() + ADOPT_HOLD_LEASES * self.lease_s
                for pid in sorted(catch_up):
                    self.o.spawn(self.catch_up(pid))
                # (and none while away: the CAS would wait in the client's buffer and take the
                # lease the moment it is back, before its owner could renew it)
                if nc.is_connected:
                    holding = self.o.mono() < self._adopt_from
                    for pid, lease, rev in self.leases.expired():
                        if (
                            holding
                            and lease.expires + self.grace_s >= self._lapsed_before
                            and lease.expires < self._back_at + self.lease_s
                        ):
                            continue  # it may have lapsed only while the server was away
                        if pid not in self._adopting:
                            self._adopting.add(pid)
                            self.o.spawn(self.adopt(pid, lease, rev))
                now = self.o.mono()
                busy = self._keeping is not None and not self._keeping.done()
                if now - self._kept_fresh_at >= self.keep_fresh_every() and not busy:
                    self._kept_fresh_at = now
                    self._keeping = self.o.spawn(self.keep_fresh())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("ownership pass failed: %s", exc)

    def keep_fresh_every(self) -> float:
        """How often `keep_fresh` looks: every `keep_fresh_check_s`, or twice per
        refresh interval when that is shorter (a short `--keep-hours`), so that keys are
        written again well before they expire."""
        return min(self.keep_fresh_check_s, self.refresh_every() / 2)

    def refresh_every(self) -> float:
        """A live pipeline's keys are written again once this old: `refresh_s`, or a third
        of the buckets' max age when another replica made it shorter than this one's."""
        kept = self.buckets_keep_s
        if kept is None or kept >= self.o.keep_s:
            return self.refresh_s
        return min(self.refresh_s, KEEP_FRESH_SHARE * kept)

    async def _read_keep(self) -> None:
        """The shortest max age of the buckets `keep_fresh` writes again (a failed read keeps
        the last one known). Each replica sets it to its own `--keep-hours` when it starts, so
        the last one started decides; a shorter one than this replica's would let the keys of
        pipelines it holds expire while they run, unless they are written sooner."""
        kvs = [self.runs.kv]
        if self.o.recovery.ledger is not None:
            kvs.append(self.o.recovery.ledger.kv)
        try:
            ages = [(await kv.status()).ttl for kv in kvs if kv is not None]
        except Exception as exc:
            log.debug("reading the buckets' max age failed: %s", exc)
            return
        kept = min((a for a in ages if a), default=None)
        if kept is not None and kept < self.o.keep_s and kept != self.buckets_keep_s:
            log.warning(
                "the pipelines' buckets keep keys %.0f s, not this replica's %.0f s (another "
                "replica runs with a shorter --keep-hours?): live pipelines' keys are written "
                "again every %.0f s; give every replica the same --keep-hours",
                kept, self.o.keep_s, KEEP_FRESH_SHARE * kept,
            )  # fmt: skip
        self.buckets_keep_s = kept

    async def keep_fresh(self) -> int:
        """Write again the spec, record and committed results of each live pipeline held here
        whose keys were last written `refresh_every()` ago: they expire the buckets' max age
        (`Orchestrator.keep_s`, unless a replica started since with a shorter one) after
        their last write, and a pipeline that outlives that would lose what an adopter needs
        (its spec, its record) and what keeps its results exactly-once. Returns how many
        pipelines' keys were written."""
        o, n = self.o, 0
        await self._read_keep()
        refresh_s = self.refresh_every()
        for pid, at in list(self._written.items()):
            run = o.pipelines.get(pid)
            if run is None or run.terminal:
                del self._written[pid]  # its keys are to expire now (its end wrote them last)
                continue
            if o.mono() - at < refresh_s or not self.may_act(pid):
                continue
            try:
                await self.runs.touch_spec(pid, run.spec)
                await self.persist(run)  # with any write under way (it retries a failed one)
                if o.recovery.ledger is not None:
                    await o.recovery.ledger.touch(pid, len(run.spec.tasks))
            except Exception as exc:  # looked at again at the next check
                log.warning("writing the keys of %s again failed: %s", pid, exc)
                continue
            if pid in self._written:  # not ended meanwhile
                self._written[pid] = o.mono()
            n += 1
        self.kept_fresh += n
        return n

    def suspend(self) -> None:
        """Stop renewing and adopting, as a partitioned or frozen replica would (fail-over
        drills and tests); the leases then lapse and other replicas take the pipelines."""
        if self._loop is not None:
            self._loop.cancel()

    async def catch_up(self, pid: str) -> None:
        """Apply task events this replica may have missed while disconnected, and write the
        record: while the lease had lapsed no write was made (fenced), an end's included, and
        nothing else writes that end again (nor gives its lease back)."""
        run = self.o.pipelines.get(pid)
        if run is None or not self.may_act(pid):
            return  # its lease not renewed yet: caught up when it is (`resumed`), or adopted
        if not run.terminal:
            n = await self.replay(run)
            if n:
                run.note(f"caught up on {n} task events from the stream after a reconnect")
        await self.o.persist(run)
        await self.o.displaced.resume(pid)  # notices that came while the lease had lapsed

    async def adopt(self, pid: str, lease: Any, revision: int) -> None:
        try:
            await self._adopt(pid, lease, revision)
        except Exception as exc:
            if pid in self.leases.held and pid not in self.o.pipelines:
                # taken, and cut short before its run was set up here (its record unread):
                # held, it would be renewed for ever with nobody driving the pipeline
                self.let_go(pid)
                log.warning("adopting %s failed (%r): its lease is left to lapse", pid, exc)
            else:
                log.warning("adopting %s failed: %r", pid, exc)
        finally:
            self._adopting.discard(pid)

    async def _adopt(self, pid: str, lease: Any, revision: int) -> None:
        o = self.o
        epoch = await self.leases.take(pid, lease, revision)
        if epoch is None:
            return  # another replica won the CAS
        if lease.owner not in self._swept and lease.owner != o.owner:
            self._swept[lease.owner] = None
            while len(self._swept) > MAX_SWEPT:
                self._swept.pop(next(iter(self._swept)))
            o.spawn(self._give_back_ended(lease.owner))
        found = await self.runs.record(pid)
        spec = await self.runs.spec(pid)
        placing = found is not None and found[0].state == "placing"
        if placing and spec is not None:
            # recorded while it was being placed (its owner back from an outage writes what
            # it holds, `catch_up`) and never since: nothing was committed as far as the
            # record knows, and resuming it as it says would leave it "placing" for good,
            # every task pending (a replica killed just after a server restart, say).
            # Placed anew, as one answered and never recorded
            found = None
        if found is None and spec is None:
            # claimed, and its owner died before answering (a spec is written before every
            # answer): nobody was told of it, and its id is freed for a submit to claim
            # again (kept taken, every submit of it would be refused as "being placed")
            log.warning("adopted %s, claimed by %s and never answered: id freed", pid, lease.owner)
            self.freed += 1
            await self.leases.free(pid)
            self.give_back_strays(pid, keep=())  # what it booked is nobody's
            await o.notify_changed()
            return
        if found is None and spec is not None:
            # answered (the spec is written first) and not recorded: nothing says where its
            # tasks went or whether they were started; it is placed anew here, under the
            # lease just taken (tasks its first owner started are refused, and go elsewhere)
            self.placed_anew += 1
            self._spec_saved.add(pid)
            why = f"adopted by {o.owner} from {lease.owner} (epoch {epoch}) with no record"
            why += " but one from before its placement committed: " if placing else ": "
            await o.submissions.place_anew(pid, spec, why + "placed anew")
            run = o.pipelines.get(pid)
            if run is not None and not run.terminal:  # (a pipeline that ended gave all back)
                self.give_back_strays(pid, keep=run.devices())
            return
        if found is None or spec is None:
            log.warning("adopted %s but it has no spec; giving it up", pid)
            await self.leases.release(pid)
            return
        rec, rev = found
        if rec.state in TERMINAL_STATES:
            await self.leases.release(pid)
            return
        run = from_record(rec, spec, owner=o.owner, mono=o.mono(), wall=o.wall())
        self._rev[pid], self._seq[pid] = rev, rec.events_seq
        self._adoptions[pid] = rec.adoptions + 1
        self._spec_saved.add(pid)
        self._written[pid] = -math.inf  # how old its keys are is not known here
        self.adopted += 1
        run.note(f"adopted by {o.owner} from {lease.owner} (epoch {epoch})")
        o.remember(run)
        n = await self.replay(run)
        log.info("adopted pipeline %s from %s (epoch %d, %d events)", pid, lease.owner, epoch, n)
        await self._renew_bookings(run)
        self.give_back_strays(pid, keep=run.devices())
        if not run.terminal:
            await self.replace_lost(run)
            self.commit_and_ask(run)
            await o.persist(run)
        await o.notify_changed()

    def commit_and_ask(self, run: PipelineRun) -> None:
        """An owner commits a new plan after its submit reply, by plain messages it confirms
        a second later (docs/protocol.md): one that died in between left tasks accepted and
        never committed, each waiting for this replica's stall watchdog (`stall_s`, 10 s by
        default) to be told again. Commits are idempotent (an agent ignores one for a job it
        committed, ran, or no longer holds, or under another token), so every task the
        pipeline holds as accepted is committed again now, by request. Its agents are asked
        too whether they hold those jobs, and the started ones (`JobQuery`): the record names
        a task's agent, not the incarnation it was placed under, so an agent that restarted
        while the dead owner could not act on it (its recovery held, or NATS away) lost them
        unseen; one it lost is reported cancelled and placed again now, not a stall time
        later (a started one would wait until the watchdog found it overdue, far past its
        prediction, and asked two looks later)."""
        held = {t: tr for t, tr in run.tasks.items() if tr.agent_id}
        waiting = {t for t, tr in held.items() if tr.state == "accepted"}
        started = {t for t, tr in held.items() if tr.state == "started"}
        if waiting:
            self.o.spawn(self.o.commits.commit_all(run, waiting))
        if waiting or started:
            self.o.spawn(self.o.watchdog.ask_about(run, sorted(waiting | started), "adopted"))

    async def _give_back_ended(self, owner: str) -> None:
        """A dead owner's windows of pipelines that have ended (their lease kept as done) or
        that nobody holds (an id freed): it gave such windows back lazily, with a key's next
        write or a moment later, and what it had not written yet died with it. They go now,
        not when their lease runs out. Its live pipelines' windows stay: their adopters keep
        them. Once per dead owner, on its first pipeline adopted here."""
        o = self.o
        pids = sorted({
            w.pipeline_id for cur in list(o.store.cache.values()) for w in cur.book.windows
            if w.owner == owner
        })  # fmt: skip
        for pid in pids:
            run = o.pipelines.get(pid)
            if run is not None and not run.terminal:
                continue  # ours now
            try:
                got = await self.leases.read(pid)
            except Exception as exc:
                log.debug("reading the lease of %s failed: %r", pid, exc)
                continue
            if got is None or got[0].expires <= 0.0:  # freed, or ended
                self.give_back_strays(pid, keep=())

    def give_back_strays(self, pid: str, keep: Collection[str]) -> None:
        """A pipeline changing hands: its windows on keys of devices other than `keep`'s
        (scheduler ids) are no placement's (booked by the dead owner in a round it never
        finished, or left by an earlier placement not given back yet) and go now, not when
        the dead owner's lease on them runs out (up to `Orchestrator.lease_s`)."""
        o = self.o
        mine = {device_key_of(d) for d in keep}
        for key in o.store.keys_holding(pid):
            if key not in mine:
                o.store.defer_release(key, pid, o.wall())

    async def _renew_bookings(self, run: PipelineRun) -> None:
        """The dead owner's last renewal may be old: extend the windows at once."""
        o, now = self.o, self.o.wall()
        for key in sorted({device_key_of(d) for d in run.devices()}):
            with contextlib.suppress(Exception):
                await o.store.renew(key, {run.pipeline_id}, now + o.lease_s, now)

    async def replace_lost(self, run: PipelineRun) -> None:
        """Unfinished tasks on agents this replica does not see alive go elsewhere, through
        the same recovery path as a dead agent's (producers whose outputs died re-run too)."""
        o = self.o
        alive = {e.advert.agent_id for e in o.view.alive(o.mono())}
        gone = {
            tr.agent_id for tr in run.tasks.values()
            if tr.agent_id and tr.agent_id not in alive
            and tr.state not in TASK_ENDED_STATES
        }  # fmt: skip
        if gone:
            await o.recovery.recover_run(run, None, gone, "fail-over (agents gone)")

    # -- replay ---------------------------------------------------------------------------------
    async def replay(self, run: PipelineRun) -> int:
        """Feed the pipeline's task events after the last known sequence through the normal
        event path; returns how many were read. Repeats are not counted as duplicates."""
        o, pid = self.o, run.pipeline_id
        after = self._seq.get(pid, 0)
        name = f"replay-{uuid.uuid4().hex[:12]}"
        cfg = ConsumerConfig(
            name=name,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE if after else DeliverPolicy.ALL,
            opt_start_seq=after + 1 if after else None,
            ack_policy=AckPolicy.NONE,
            filter_subject=f"{subjects.EVENTS}.task.{pid}.>",
            inactive_threshold=10.0,
            mem_storage=True,
        )
        info = await o.js.add_consumer(subjects.EVENTS_STREAM, config=cfg)
        n = 0
        pacer = Pacer()  # a long replay leaves placements their turns
        try:
            sub = await o.js.pull_subscribe_bind(name=name, stream=subjects.EVENTS_STREAM)
            pending = info.num_pending
            while pending > 0:
                try:
                    msgs = await sub.fetch(min(pending, REPLAY_BATCH), timeout=5.0)
                except nats.errors.TimeoutError:
                    log.warning("replay of %s stopped with %d events pending", pid, pending)
                    break
                for i, msg in enumerate(msgs):
                    await pacer.pace(i > 0)
                    if not self.may_act(pid):
                        # fenced from here on: applied by the replay after the lease is back,
                        # which must start here (the mark is not moved past what was not read)
                        pending = 0
                        break
                    dup, stale = run.duplicate_events, run.stale_events
                    await o.on_task_event(msg)
                    # an event seen before is a replay here, not a duplicate delivery
                    run.duplicate_events = min(run.duplicate_events, dup)
                    run.stale_events = min(run.stale_events, stale)
                    meta = msg.metadata
                    self._seq[pid] = max(self._seq.get(pid, 0), meta.sequence.stream)
                    pending = meta.num_pending
                    n += 1
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        finally:
            with contextlib.suppress(Exception):
                await o.js.delete_consumer(subjects.EVENTS_STREAM, name)
        self.replayed += n
        return n
