"""Pipeline ownership as a lease in JetStream KV, and the record a new owner resumes from.

A replica that takes a submit creates `MARS_OWNERS/<pipeline>` = {owner, expires, epoch}; it
renews by compare-and-set on the key's revision. A replica acts on a pipeline (applies results,
persists, re-places) only while its lease is locally valid: until `lease_s - grace_s` after the
renewal it last sent. Others adopt a lease only `grace_s` after it expired on their clock, by
CAS again, so exactly one wins and bumps the epoch; the loser of a renewal race has lost the
pipeline and stops. A finished pipeline's lease stays (marked done) so a re-submit of its id
is recognised, and the bucket's TTL sweeps it a day later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nats.js.errors import (
    BucketNotFoundError,
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)

from orchestrator.infra.kvwatch import follow
from orchestrator.scheduling import Placement
from orchestrator.state.pipelines import PipelineRun, TaskRun
from schemas.codec import DecodeError, decode, encode, encode_trusted
from schemas.failover import (
    OWNERS_BUCKET,
    RUNS_BUCKET,
    OwnerLease,
    PipelineRecord,
    run_key,
    spec_key,
)
from schemas.pipeline import PipelineSpec
from transport import connect

log = logging.getLogger("mars.ownership")
#: Leases, records, specs and committed results are swept this long after their last write
#: (their buckets' max age; `mars orchestrator --keep-hours`); the owner of a live pipeline
#: writes its own again before (`Failover.keep_fresh`), so only those of pipelines that ended
#: go.
KEEP_S = 24 * 3600.0
#: Counters other modules keep on a run that a new owner should carry on from.
EXTRA_COUNTERS = ("results_committed", "results_dropped", "recoveries")


class LeaseTaken(Exception):
    """Another replica holds (or held) this pipeline id."""

    def __init__(self, lease: OwnerLease | None) -> None:
        super().__init__(lease.owner if lease else "unknown owner")
        self.lease = lease


@dataclass
class Held:
    epoch: int
    revision: int
    #: Monotonic instant until which this replica may act on the pipeline.
    valid_until: float
    #: Local validity ran out (renewals failed); the next successful renewal resumes it.
    lapsed: bool = False


async def open_bucket(js: Any, bucket: str, *, history: int = 1, ttl: float | None = None) -> Any:
    """The bucket, made if missing; with `ttl`, an existing one whose max age differs (made by
    an older version, or under another `--keep-hours`) is given that one."""
    try:
        kv = await js.key_value(bucket)
    except BucketNotFoundError:
        with contextlib.suppress(Exception):  # a concurrent replica may create it first
            await js.create_key_value(
                bucket=bucket, history=history, ttl=ttl, replicas=connect.js_replicas()
            )
        return await js.key_value(bucket)
    if ttl is not None:
        await keep_for(js, kv, bucket, ttl)
    return kv


async def keep_for(js: Any, kv: Any, bucket: str, ttl: float) -> None:
    """Set the bucket's max age to `ttl` s if it is not that already; a bucket that cannot be
    changed (permissions) keeps its own, said in the log."""
    status = await kv.status()
    if status.ttl and abs(status.ttl - ttl) < 1e-3:
        return
    cfg = status.stream_info.config
    window = min(cfg.duplicate_window or ttl, ttl)  # the server wants it <= the max age
    try:
        await js.update_stream(cfg, max_age=ttl, duplicate_window=window)
    except Exception as exc:
        log.warning(
            "bucket %s keeps its max age (%s s): setting %.0f s failed: %s",
            bucket, status.ttl or "none", ttl, exc,
        )  # fmt: skip
        return
    log.info("bucket %s: max age %s -> %.0f s", bucket, status.ttl or "none", ttl)


class Leases:
    def __init__(
        self,
        js: Any,
        owner: str,
        *,
        lease_s: float,
        grace_s: float,
        mono: Callable[[], float],
        wall: Callable[[], float],
        keep_s: float = KEEP_S,
        connection: Callable[[], int] = lambda: 0,
    ) -> None:
        self.js, self.owner = js, owner
        self.keep_s = keep_s
        self.lease_s, self.grace_s = lease_s, grace_s
        self.mono, self.wall = mono, wall
        #: Which connection to the server this is (its client's reconnect count).
        self.connection = connection
        #: connection -> the latest instant (booking clock) a renewal (or, renewing none, a
        #: `confirm_up`) was sent on it that the server answered on the same connection: it
        #: was up then.
        self.up_at: dict[int, float] = {}
        self.kv: Any = None
        self.held: dict[str, Held] = {}
        #: Every live lease in the bucket as last seen: pipeline -> (lease, revision).
        self.seen: dict[str, tuple[OwnerLease, int]] = {}
        self._watcher: Any = None
        self._watch_task: asyncio.Task[None] | None = None
        #: Set, and replaced by a fresh one, whenever `seen` or `up_at` changes.
        self._changed = asyncio.Event()

    def _note_change(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> None:
        """In-process wait until `predicate` holds, re-checked whenever `seen` or `up_at`
        changes (tests, as `Replicas.wait_until`)."""
        async with asyncio.timeout(timeout):
            while not predicate():
                await self._changed.wait()

    async def start(self) -> None:
        self.kv = await open_bucket(self.js, OWNERS_BUCKET, ttl=self.keep_s)
        await self.watch()

    async def watch(self) -> None:
        """(Re)start the watched copy of the bucket (after a reconnect, too)."""
        await self._stop_watch()
        self._watcher = await self.kv.watchall()
        while True:  # initial values end with a None marker
            entry = await self._watcher.updates(timeout=5)
            if entry is None:
                break
            self._apply(entry)
        self._watch_task = asyncio.create_task(self._watch())

    async def _stop_watch(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch_task
            self._watch_task = None
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.stop()
            self._watcher = None

    async def stop(self) -> None:
        await self._stop_watch()

    async def _watch(self) -> None:
        await follow(self._watcher, self._apply)

    def _apply(self, entry: Any) -> None:
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            self.seen.pop(entry.key, None)
            self._note_change()
            return
        cur = self.seen.get(entry.key)
        if cur is not None and cur[1] >= entry.revision:
            return
        try:
            lease = decode(entry.value, OwnerLease)
        except DecodeError:
            return
        if lease.expires <= 0.0:  # done: nothing to adopt, nothing to keep in memory
            self.seen.pop(entry.key, None)
        else:
            self.seen[entry.key] = (lease, entry.revision)
        self._note_change()

    def _lease(self, pid: str, epoch: int) -> OwnerLease:
        return OwnerLease(
            pipeline_id=pid, owner=self.owner[:256], expires=self.wall() + self.lease_s, epoch=epoch
        )

    def _hold(self, pid: str, epoch: int, revision: int, sent: float) -> None:
        self.held[pid] = Held(epoch, revision, sent + self.lease_s - self.grace_s)

    async def read(self, pid: str) -> tuple[OwnerLease, int] | None:
        try:
            entry = await self.kv.get(pid)
        except (KeyNotFoundError, KeyDeletedError):  # never claimed, or freed (`free`)
            return None
        try:
            return decode(entry.value, OwnerLease), int(entry.revision)
        except DecodeError:
            return None

    async def claim(self, pid: str) -> None:
        """Own a new pipeline id; raises LeaseTaken when the id is (or was) someone's."""
        sent = self.mono()
        try:
            rev = await self.kv.create(pid, encode(self._lease(pid, 1)))
        except KeyWrongLastSequenceError:
            cur = await self.read(pid)
            raise LeaseTaken(cur[0] if cur else None) from None
        self._hold(pid, 1, int(rev), sent)

    async def take(self, pid: str, lease: OwnerLease, revision: int) -> int | None:
        """Adopt an expired lease by CAS; the new epoch, or None when someone else won."""
        sent = self.mono()
        epoch = lease.epoch + 1
        try:
            rev = await self.kv.update(pid, encode(self._lease(pid, epoch)), last=revision)
        except KeyWrongLastSequenceError:
            return None
        self._hold(pid, epoch, int(rev), sent)
        return epoch

    def may_act(self, pid: str) -> bool:
        h = self.held.get(pid)
        return h is not None and self.mono() < h.valid_until

    def epoch(self, pid: str) -> int:
        h = self.held.get(pid)
        return h.epoch if h is not None else 0

    async def renew_all(self) -> tuple[list[str], list[str]]:
        """Renew every held lease; returns (lost to another replica, resumed after a lapse)."""
        pids = list(self.held)
        outcomes = await asyncio.gather(*(self._renew(p) for p in pids), return_exceptions=True)
        lost, resumed = [], []
        for pid, out in zip(pids, outcomes, strict=True):
            if out == "lost":
                lost.append(pid)
            elif out == "resumed":
                resumed.append(pid)
        return lost, resumed

    async def confirm_up(self) -> None:
        """For a replica renewing no lease: a JetStream request on the bucket's stream (its
        info), whose answer on the same connection says the server was up when it was sent,
        as a stored renewal does (`up_at`). Raises if it went unanswered."""
        sent_wall, conn = self.wall(), self.connection()
        await self.kv.status()
        self._was_up(conn, sent_wall)

    def _was_up(self, conn: int, sent_wall: float) -> None:
        """A request sent at `sent_wall` on connection `conn` was answered: the server was up
        then, unless the answer came on a later connection (one sent while away waits in the
        client's buffer, and goes out after the reconnect)."""
        if self.connection() != conn:
            return
        self.up_at[conn] = max(self.up_at.get(conn, -math.inf), sent_wall)
        for old in [c for c in self.up_at if c < conn - 1]:
            del self.up_at[old]
        self._note_change()

    async def _renew(self, pid: str) -> str:
        h = self.held.get(pid)
        if h is None:
            return "gone"
        sent, sent_wall, conn = self.mono(), self.wall(), self.connection()
        if sent >= h.valid_until:
            h.lapsed = True
        try:
            rev = await self.kv.update(pid, encode(self._lease(pid, h.epoch)), last=h.revision)
            self._was_up(conn, sent_wall)
        except KeyWrongLastSequenceError:
            cur = await self.read(pid)
            if cur is not None and cur[0].owner == self.owner and cur[0].epoch == h.epoch:
                h.revision = cur[1]  # our own write landed but its ack was lost: retry next tick
                return "kept"
            self.held.pop(pid, None)
            return "lost"
        except Exception as exc:  # offline: validity lapses on its own
            log.debug("renewing the lease of %s failed: %s", pid, exc)
            return "failed"
        if self.held.get(pid) is not h:
            return "gone"  # released meanwhile
        h.revision, h.valid_until = int(rev), sent + self.lease_s - self.grace_s
        if h.lapsed:
            h.lapsed = False
            return "resumed"
        return "ok"

    async def release(self, pid: str) -> None:
        """A finished pipeline: keep its lease as done (no one adopts it, its id stays taken)."""
        h = self.held.pop(pid, None)
        if h is None:
            return
        done = OwnerLease(pipeline_id=pid, owner=self.owner[:256], expires=0.0, epoch=h.epoch)
        with contextlib.suppress(Exception):
            await self.kv.update(pid, encode(done), last=h.revision)

    async def free(self, pid: str) -> None:
        """Give the id up unowned (its lease deleted at the revision held): the next submit of
        it claims it anew. For a pipeline nobody was told of (`Failover._adopt`)."""
        h = self.held.pop(pid, None)
        if h is None:
            return
        with contextlib.suppress(Exception):  # lost to a write since: that one decides
            await self.kv.delete(pid, last=h.revision)

    def expired(self) -> list[tuple[str, OwnerLease, int]]:
        """Leases of others (or of a previous life of ours) past expiry plus grace."""
        now = self.wall()
        return [
            (pid, lease, rev)
            for pid, (lease, rev) in self.seen.items()
            if pid not in self.held and now > lease.expires + self.grace_s
        ]


class RunStore:
    """`MARS_RUNS`: each pipeline's spec (written once) and resumable record (written by CAS)."""

    def __init__(self, js: Any, keep_s: float = KEEP_S) -> None:
        self.js = js
        self.keep_s = keep_s
        self.kv: Any = None

    async def start(self) -> None:
        self.kv = await open_bucket(self.js, RUNS_BUCKET, ttl=self.keep_s)

    async def save_spec(self, pid: str, spec: PipelineSpec) -> None:
        with contextlib.suppress(KeyWrongLastSequenceError):  # written before: specs never change
            await self.kv.create(spec_key(pid), encode(spec))

    async def touch_spec(self, pid: str, spec: PipelineSpec) -> None:
        """Write the spec again (it never changes), so it outlives the max age while the pipeline
        does: a spec gone makes the pipeline impossible to adopt."""
        await self.kv.put(spec_key(pid), encode(spec))

    async def spec(self, pid: str) -> PipelineSpec | None:
        try:
            return decode((await self.kv.get(spec_key(pid))).value, PipelineSpec)
        except (KeyNotFoundError, DecodeError):
            return None

    async def record(self, pid: str) -> tuple[PipelineRecord, int] | None:
        try:
            entry = await self.kv.get(run_key(pid))
            return decode(entry.value, PipelineRecord), int(entry.revision)
        except (KeyNotFoundError, DecodeError):
            return None

    async def write(self, fields: dict[str, Any], last: int | None) -> int:
        """Create the record (`record_fields`), or replace revision `last`
        (KeyWrongLastSequenceError if moved)."""
        key, data = run_key(fields["pipeline_id"]), encode_trusted(fields)
        rev = await (self.kv.create(key, data) if last is None else self.kv.update(key, data, last))
        return int(rev)


def record_fields(
    run: PipelineRun, *, epoch: int, events_seq: int, adoptions: int, mono: float, wall: float
) -> dict[str, Any]:
    """What a new owner needs (a `PipelineRecord`), with monotonic instants mapped onto the
    booking clock, as plain values in the record's field order for `encode_trusted`: the
    record is written on every change of a pipeline, and building its ~60 models to encode
    them took ~130 us of the ~170 (20 tasks). Values come from validated input and this
    process; tests check the result against the schema for arbitrary runs."""

    def on_wall(t: float | None) -> float | None:
        return None if t is None else max(0.0, wall - (mono - t))

    tasks = run.tasks
    return {
        "pipeline_id": run.pipeline_id,
        "name": run.spec.name,
        "owner": run.owner[:256],
        "epoch": epoch,
        "state": run.state,
        "reason": run.reason[:2048],
        "algorithm": run.algorithm[:256],
        "planned_makespan_s": max(0.0, run.planned_makespan_s),
        "planned_cost": max(0.0, run.planned_cost),
        "plan": [
            {
                "task_id": p.task_id, "agent_id": p.agent_id, "device_id": p.device_id,
                "slot": p.slot, "start_s": p.start_s, "finish_s": p.finish_s,
            }
            for p in run.plan
        ],
        "placements": [
            {"task_id": t, "device_id": p.device_id, "slot": p.slot, "start": p.start,
             "finish": p.finish}
            for t, p in run.placements.items()
        ],
        "tasks": [
            {"status": _status_fields(tr), "token": tr.token}
            for tr in (tasks[t.id] for t in run.spec.tasks)
        ],
        "placement_log": list(run.placement_log),
        "submitted_wall": run.submitted_wall or max(0.0, wall - (mono - run.submitted_at)),
        "t0": run.t0,
        "committed_wall": on_wall(run.committed_at),
        "finished_wall": on_wall(run.finished_at),
        "conflicts": run.conflicts,
        "rejections": run.rejections,
        "cas_retries": run.cas_retries,
        "stale_events": run.stale_events,
        "duplicate_events": run.duplicate_events,
        "counters": {c: int(getattr(run, c)) for c in EXTRA_COUNTERS if hasattr(run, c)},
        "events_seq": events_seq,
        "adoptions": adoptions,
        "evictions": dict(run.evictions),
        "user": run.spec.user,
    }  # fmt: skip


def _status_fields(tr: TaskRun) -> dict[str, Any]:
    """`TaskRun.status()` as plain values, in `TaskStatus` field order."""
    return {
        "task_id": tr.task_id, "state": tr.state, "agent_id": tr.agent_id,
        "device_id": tr.device_id, "started_s": tr.started_s, "finished_s": tr.finished_s,
        "duration_s": tr.duration_s, "predicted_s": tr.predicted_s,
        "output_bytes": tr.output_bytes, "result": tr.result, "error": tr.error,
        "output_sha256": tr.output_sha256, "output_type": tr.output_type,
        "output_key": tr.output_key,
    }  # fmt: skip


def from_record(
    rec: PipelineRecord, spec: PipelineSpec, *, owner: str, mono: float, wall: float
) -> PipelineRun:
    """Rebuild a pipeline on this replica's clocks (no event ids: replay dedupes by state)."""

    def on_mono(t: float | None) -> float | None:
        return None if t is None else mono - (wall - t)

    tasks: dict[str, TaskRun] = {}
    for tr in rec.tasks:
        s = tr.status
        tasks[s.task_id] = TaskRun(
            task_id=s.task_id,
            state=s.state,
            agent_id=s.agent_id,
            device_id=s.device_id,
            token=tr.token,
            started_s=s.started_s,
            finished_s=s.finished_s,
            duration_s=s.duration_s,
            predicted_s=s.predicted_s,
            output_bytes=s.output_bytes,
            result=s.result,
            error=s.error,
            output_sha256=s.output_sha256,
            output_type=s.output_type,
            output_key=s.output_key,
        )
    for t in spec.tasks:
        tasks.setdefault(t.id, TaskRun(t.id))
    run = PipelineRun(
        rec.pipeline_id,
        spec,
        submitted_at=mono - (wall - rec.submitted_wall),
        state=rec.state,
        reason=rec.reason,
        algorithm=rec.algorithm,
        planned_makespan_s=rec.planned_makespan_s,
        planned_cost=rec.planned_cost,
        plan=list(rec.plan),
        committed_at=on_mono(rec.committed_wall),
        finished_at=on_mono(rec.finished_wall),
        tasks=tasks,
        stale_events=rec.stale_events,
        duplicate_events=rec.duplicate_events,
        submitted_wall=rec.submitted_wall,
        t0=rec.t0,
        owner=owner,
        placements={
            p.task_id: Placement(p.task_id, p.device_id, p.slot, p.start, p.finish)
            for p in rec.placements
        },
        placement_log=list(rec.placement_log),
        conflicts=rec.conflicts,
        rejections=rec.rejections,
        cas_retries=rec.cas_retries,
        evictions=dict(rec.evictions),
    )
    for name, value in rec.counters.items():
        if name in EXTRA_COUNTERS and hasattr(run, name):
            setattr(run, name, value)
    return run
