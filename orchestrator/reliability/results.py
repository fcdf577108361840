"""Exactly-once commit of task results: each task's result is added once, by CAS, to its
pipeline's results in KV, and never changed.

The pipeline state machine already drops repeated events (by event id) and events of a
superseded placement (agent or fencing token differ). That protects one replica's memory; the
commit protects the record. Results live in `MARS_RESULTS` under `<pipeline>.<chunk>` (tasks
`CHUNK` at a time, by their place in the spec: a value stays small however large the
pipeline), a `TaskResults` each. A commit adds the tasks not there yet and writes with the
revision it read (create for a new key), so whichever replica or redelivery comes second finds
the task already there and is counted, never written. A task re-run because its output was
lost with its agent produces the same result again: the first commit stands.

Chunks expire `ownership.KEEP_S` after their last write (the bucket's max age), as records
and specs do; the owner of a live pipeline writes its chunks again before (`touch`), so only
those of pipelines that ended go and the bucket stays bounded.

Commits of one pipeline are gathered for up to `BATCH_S` (or until the pipeline ends, when
`flush` writes them at once): a pipeline's results cost one write per chunk and batch instead
of one per task, and every write its acknowledgement. The task events themselves are in the
MARS_EVENTS stream meanwhile, so a replica adopting the pipeline commits what was still
gathered here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from orchestrator.infra import eventloop
from orchestrator.reliability import ownership
from schemas import subjects
from schemas.codec import decode, encode
from schemas.events import TaskEvent
from schemas.recovery import RESULTS_PER_KEY, TaskResult, TaskResults

log = logging.getLogger("mars.results")
Outcome = Literal["committed", "duplicate", "stale", "rerun", "error"]
#: Tasks per results key (by their place in the pipeline's spec).
CHUNK = RESULTS_PER_KEY
#: Revisions the bucket keeps per key: every write that adds a task to a chunk is kept (at
#: most CHUNK), so the audit (`revisions`) sees each one.
HISTORY = 64
#: Commits of a pipeline are gathered this long before they are written (its end writes them
#: at once).
BATCH_S = 0.25
CAS_TRIES = 8
#: A write that failed (the server away, a reconnect under way, the CAS race lost every try)
#: is tried again, with doubling waits from RETRY_FIRST_S up to RETRY_MAX_S, for this long
#: before its commits are given up as `error`: a batch due while the server restarted was
#: lost, and its pipeline ended succeeded with no result committed for those tasks.
RETRY_FOR_S = 15.0
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 2.0
#: Chunks whose last written value is kept, to write the next without reading it first.
KNOWN_KEPT = 4096


def result_key(pipeline_id: str, index: int) -> str:
    """The key holding the result of the task at `index` in its pipeline's spec."""
    return f"{pipeline_id}.{index // CHUNK}"


@dataclass
class _Ask:
    ev: TaskEvent
    key: str
    done: asyncio.Future[Outcome]


class ResultLedger:
    def __init__(
        self,
        js: Any,
        owner: str,
        *,
        bucket: str = subjects.RESULTS_BUCKET,
        keep_s: float = ownership.KEEP_S,
    ) -> None:
        self.js = js
        #: Chunks expire this long after their last write.
        self.keep_s = keep_s
        self.owner = owner
        self.bucket = bucket
        self.kv: Any = None
        #: Commits gathered per pipeline, not written yet.
        self._asked: dict[str, list[_Ask]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._writing: set[asyncio.Task[None]] = set()
        #: key -> (revision, results) as this ledger last wrote or read it.
        self._known: OrderedDict[str, tuple[int, TaskResults]] = OrderedDict()
        #: pipeline -> its keys in `_known`
        self._keys: dict[str, set[str]] = {}
        #: key -> (its lock, writes holding or awaiting it): one write of a key at a time
        #: here, so a batch due and the pipeline's end do not race each other by CAS
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self.writes = 0
        #: Writes tried again after one failed.
        self.retries = 0
        #: Notified after each write tried (`writes`, `retries`): `wait_until` waits on it.
        self._tried = asyncio.Condition()

    async def start(self) -> None:
        # a bucket made by a version that kept every chunk for ever gets the max age
        self.kv = await ownership.open_bucket(
            self.js, self.bucket, history=HISTORY, ttl=self.keep_s
        )
        history = (await self.kv.status()).history
        if history < HISTORY:
            log.warning(
                "bucket %s keeps %d revisions per key (made by an older version); the audit "
                "sees only the last ones of a chunk written more often",
                self.bucket, history,
            )  # fmt: skip

    async def stop(self, deadline: float | None = None) -> None:
        """Write what is still gathered (a replica adopting the pipelines would, from the
        events, but this is sooner), and wait for the writes under way, until `deadline`
        (event-loop time) at the latest: what is left then is dropped."""
        gathered = sum(map(len, self._asked.values()))

        async def write_all() -> None:
            for pid in list(self._asked):
                with contextlib.suppress(Exception):
                    await self.flush(pid)
            await asyncio.gather(*self._writing, return_exceptions=True)

        if not await eventloop.done_by(deadline, write_all()):
            log.warning(
                "stopping: results gathered (%d) or being written not all written (out of "
                "time, or NATS out of reach); an adopting replica commits them from the task "
                "events", gathered,
            )  # fmt: skip
        for task in list(self._writing):
            task.cancel()

    def ask(self, ev: TaskEvent, index: int) -> asyncio.Future[Outcome]:
        """Commit a `succeeded` event's result (the task at `index` in the spec) unless one is
        already there; gathered now, written with its pipeline's next batch (`flush`, or
        BATCH_S later). The future says how it went: committed, or why not."""
        pid = ev.pipeline_id
        loop = asyncio.get_running_loop()
        ask = _Ask(ev, result_key(pid, index), loop.create_future())
        self._asked.setdefault(pid, []).append(ask)
        if pid not in self._timers:
            self._timers[pid] = loop.call_later(BATCH_S, self._due, pid)
        return ask.done

    def _due(self, pid: str) -> None:
        self._timers.pop(pid, None)
        task = asyncio.get_running_loop().create_task(self.flush(pid))
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)

    async def flush(self, pipeline_id: str) -> None:
        """Write the pipeline's gathered commits now (its end: `Recovery.settle`)."""
        timer = self._timers.pop(pipeline_id, None)
        if timer is not None:
            timer.cancel()
        asks = self._asked.pop(pipeline_id, [])
        per_key: dict[str, list[_Ask]] = {}
        for a in asks:
            per_key.setdefault(a.key, []).append(a)
        await asyncio.gather(*(self._write(k, batch) for k, batch in per_key.items()))

    def forget(self, pipeline_id: str) -> None:
        """The pipeline ended here: its chunks' values need not be kept."""
        for key in self._keys.pop(pipeline_id, ()):
            self._known.pop(key, None)

    async def touch(self, pipeline_id: str, tasks: int) -> int:
        """Write the pipeline's chunks again, unchanged, so that none expires while it lives
        (a chunk gone would let a late or re-run result of its tasks be committed again).
        Returns how many were written; a chunk someone wrote meanwhile is fresh already."""
        written = 0
        for c in range((tasks + CHUNK - 1) // CHUNK):
            key = result_key(pipeline_id, c * CHUNK)
            async with self._key_lock(key):
                try:
                    entry = await self.kv.get(key)
                except KeyNotFoundError:
                    continue  # nothing committed in it yet
                # the value kept here (if any) has the old revision: the next commit reads it
                self._known.pop(key, None)
                with contextlib.suppress(KeyWrongLastSequenceError):  # written meanwhile
                    await self.kv.update(key, entry.value, last=entry.revision)
                    written += 1
        return written

    @contextlib.asynccontextmanager
    async def _key_lock(self, key: str) -> AsyncIterator[None]:
        """One write of a key at a time here; the lock goes when nobody holds or awaits it."""
        lock, users = self._locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[key]

    async def _write(self, key: str, batch: list[_Ask]) -> None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + RETRY_FOR_S
        wait = RETRY_FIRST_S
        outcome: dict[int, Outcome] | None = None
        try:
            async with self._key_lock(key):
                while True:
                    outcome = await self._write_now(key, batch, again=outcome is not None)
                    if len(outcome) == len(batch) or loop.time() + wait > give_up:
                        break
                    self.retries += 1
                    await self._note_tried()
                    await asyncio.sleep(wait)  # a backoff: the server may be coming back
                    wait = min(2 * wait, RETRY_MAX_S)
        finally:  # (cancelled, the replica stopping: said `error`, never left unanswered)
            for i, a in enumerate(batch):
                if not a.done.done():
                    a.done.set_result((outcome or {}).get(i, "error"))
        await self._note_tried()

    async def _note_tried(self) -> None:
        async with self._tried:
            self._tried.notify_all()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> None:
        """In-process wait until `predicate` holds, re-checked after each write tried (tests,
        as `Replicas.wait_until`)."""
        async with asyncio.timeout(timeout), self._tried:
            await self._tried.wait_for(predicate)

    async def _write_now(
        self, key: str, batch: list[_Ask], *, again: bool = False
    ) -> dict[int, Outcome]:
        """One write of a batch (CAS_TRIES at most); each ask's outcome, none where it
        failed. `again`: a write of this batch was tried before, and may have been stored
        though its answer never came: a result there from the very same event is its own."""
        outcome: dict[int, Outcome] = {}
        try:
            for attempt in range(CAS_TRIES):
                known = self._known.get(key)
                # A key not known here is nearly always new (this replica's own pipeline):
                # written as if empty, with no read first; that write (a bare "must not
                # exist", not `create`, which reads on failure) fails when it exists, and
                # the key is read then.
                assumed = known is None and attempt == 0
                if known is None:
                    known = _empty(key) if assumed else await self._read(key)
                rev, cur = known
                have = {r.task_id: r for r in cur.results}
                added: list[TaskResult] = []
                for i, a in enumerate(batch):
                    there = have.get(a.ev.task_id)
                    if there is None:
                        have[a.ev.task_id] = TaskResult.of(a.ev, self.owner[:256])
                        added.append(have[a.ev.task_id])
                        outcome[i] = "committed"
                    elif there.token == a.ev.token:
                        mine = again and there.event_id == a.ev.event_id
                        outcome[i] = "committed" if mine else "duplicate"
                    else:
                        outcome[i] = "stale" if there.token > a.ev.token else "rerun"
                if not added:
                    break
                new = TaskResults(pipeline_id=cur.pipeline_id, results=[*cur.results, *added])
                try:
                    data = encode(new)
                    got = await (
                        self.kv.create(key, data)  # over a delete marker too
                        if rev == 0 and not assumed
                        else self.kv.update(key, data, last=rev)
                    )
                except KeyWrongLastSequenceError:
                    self._known.pop(key, None)  # another writer got there first: read it again
                    outcome.clear()
                    continue
                self.writes += 1
                self._remember(key, int(got), new)
                break
            else:
                log.warning("results %s: still losing the CAS race after %d tries", key, CAS_TRIES)
                outcome.clear()
        except Exception as exc:
            log.warning("committing results to %s failed (tried again): %s", key, exc)
            outcome.clear()
        return outcome

    def _remember(self, key: str, revision: int, value: TaskResults) -> None:
        self._known[key] = (revision, value)
        self._known.move_to_end(key)
        self._keys.setdefault(value.pipeline_id, set()).add(key)
        while len(self._known) > KNOWN_KEPT:
            old, (_rev, gone) = self._known.popitem(last=False)
            keys = self._keys.get(gone.pipeline_id)
            if keys is not None:
                keys.discard(old)
                if not keys:
                    del self._keys[gone.pipeline_id]

    async def _read(self, key: str) -> tuple[int, TaskResults]:
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:  # deleted ones too (`create` writes over the marker)
            return _empty(key)
        return int(entry.revision), decode(entry.value, TaskResults)


def _empty(key: str) -> tuple[int, TaskResults]:
    """A chunk with no results yet, as (revision 0, value): what `create` writes over."""
    return 0, TaskResults(pipeline_id=key.rsplit(".", 1)[0])


async def revisions(
    js: Any, pipeline_id: str, *, bucket: str = subjects.RESULTS_BUCKET
) -> dict[str, list[TaskResult]]:
    """Each task's committed result as every revision the bucket still holds of its
    pipeline's chunks has it, oldest first, a value carried on unchanged counted once (an
    audit: exactly once means one each).

    Counted by the server first (stream info per subject), then exactly that many messages
    read: nats-py's `kv.history` decides "no more" from a consumer-info race and can return
    nothing for a key that has a value.
    """
    stream = f"KV_{bucket}"
    prefix = f"$KV.{bucket}.{pipeline_id}."
    info = await js.stream_info(stream, subjects_filter=prefix + ">")
    total = sum((info.state.subjects or {}).values())
    out: dict[str, list[TaskResult]] = {}
    if not total:
        return out
    sub = await js.subscribe(prefix + ">", stream=stream, ordered_consumer=True)
    try:
        for _ in range(total):
            msg = await sub.next_msg(timeout=5.0)
            if not msg.data:  # a delete or purge marker holds no result
                continue
            for r in decode(msg.data, TaskResults).results:
                seen = out.setdefault(r.task_id, [])
                if not seen or seen[-1] != r:
                    seen.append(r)
    finally:
        await sub.unsubscribe()
    return out
