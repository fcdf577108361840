"""Device reservations in a JetStream KV bucket: one key per device, written by CAS.

The orchestrator keeps a watched copy of the bucket so planning reads no network. A booking
reads the cached (revision, windows), applies `book.add`, and writes with `last=revision`; the
revision the write produced is the booking's fencing token. When another writer got there
first, the key is re-read and the rule applied again, a bounded number of times; a real overlap
is returned as a conflict for the placement loop to re-plan around.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import math
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any

from nats.js.errors import (
    BadRequestError,
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)

from orchestrator.infra import eventloop
from orchestrator.infra.kvwatch import follow
from orchestrator.reservations import book as rules
from schemas.bookings import BookingWindow, DeviceBookings
from schemas.codec import DecodeError, decode, encode
from transport import connect

log = logging.getLogger("mars.reservations")
BUCKET = "MARS_BOOKINGS"
CAS_RETRIES = 8
#: A deferred release no other write of its key carried is written alone after this long.
RELEASE_FLUSH_S = 0.5
#: The most a device's key may hold, encoded: a booking that would take it further is
#: refused (`KeyFull`) and planning leaves a device whose key is there alone. Every booking
#: writes the whole key and every replica decodes it from its watch, so a deep queue costs
#: each booking in proportion (at 2,000 windows: 1.6 ms to encode, 6 ms to decode), and a
#: value over the server's `max_payload` (1 MiB by default) cannot be written at all. A
#: window with the ids `mars` makes is ~174 bytes: 256 KiB holds ~1,500.
KEY_MAX_BYTES = 256 * 1024
#: JetStream's error code for a write whose expected last revision is not the key's.
WRONG_LAST_SEQUENCE = 10071
#: Room left under the server's `max_payload` for the write's subject and headers.
PAYLOAD_HEADROOM = 8 * 1024


def _due(todo: list[Release]) -> float:
    """When a key's deferred releases are written alone: when the oldest of them falls due."""
    return min(r.due for r in todo)


def _unchanged(b: DeviceBookings) -> rules.AddResult:
    return rules.AddResult(True, b)


def device_key(agent_id: str, device_id: str) -> str:
    return f"dev.{agent_id}.{device_id}"


def device_key_of(cluster_device_id: str) -> str:
    """The key of a scheduler device id (`<agent>:<device>`), without splitting it."""
    return "dev." + cluster_device_id.replace(":", ".", 1)


def key_limit(wanted: int, max_payload: int) -> int:
    """The size limit for booking keys: `wanted`, but never more than a server whose
    `max_payload` is this can take in one write."""
    return max(1, min(wanted, max_payload - PAYLOAD_HEADROOM))


def device_of_key(key: str) -> str:
    """The scheduler device id (`<agent>:<device>`) of a key `device_key` made (ids never hold
    a dot)."""
    return key.removeprefix("dev.").replace(".", ":", 1)


class KeyFull(Exception):
    """A booking would take a device's key past the store's limit: the device's queue of
    booked windows is as deep as this orchestrator lets it grow."""

    def __init__(self, key: str, size: int, limit: int, windows: int) -> None:
        self.key = key
        self.reason = full_reason(size, limit, windows)
        super().__init__(f"{key}: {self.reason}")


def full_reason(size: int, limit: int, windows: int) -> str:
    return (
        f"booking queue full: {windows} windows in {size / 1024:.0f} KiB, the key's limit "
        f"is {limit / 1024:.0f} KiB"
    )


@dataclass
class Cached:
    revision: int
    book: DeviceBookings
    _rows: tuple[rules.Row, ...] | None = field(default=None, repr=False, compare=False)

    def rows(self) -> tuple[rules.Row, ...]:
        """The windows as plain tuples, made once per revision (planning reads them all)."""
        if self._rows is None:
            self._rows = rules.rows(self.book)
        return self._rows


@dataclass
class BookResult:
    ok: bool
    key: str
    #: Fencing token: the revision this booking produced (0 when not booked).
    token: int = 0
    conflicts: list[BookingWindow] = field(default_factory=list)
    evicted: list[BookingWindow] = field(default_factory=list)
    cas_retries: int = 0
    #: Not booked because the key would pass the store's limit (`KeyFull`): why, else "".
    full: str = ""


@dataclass(frozen=True)
class Prepared:
    """A key's next value worked out ahead of its write (`BookingStore.prepare`): written as
    it is if the cached value is still `base` then, else worked out again."""

    base: Cached | None
    result: rules.AddResult
    #: The encoded new value; None when there is nothing to write (refused, or unchanged).
    data: bytes | None
    #: The key's deferred releases the new value carries.
    released: tuple[Release, ...] = ()


@dataclass(frozen=True)
class Release:
    """A release not written yet (`BookingStore.defer_release`): `book.release`'s arguments."""

    pipeline_id: str
    now: float
    task_ids: frozenset[str] | None = None
    exact: frozenset[tuple[str, float, float]] | None = None
    #: Event-loop time by which it is written, alone if nothing carried it.
    due: float = 0.0

    @classmethod
    def of(
        cls,
        pipeline_id: str,
        now: float,
        task_ids: Collection[str] | None = None,
        exact: Collection[tuple[str, float, float]] | None = None,
        due: float = 0.0,
    ) -> Release:
        return cls(
            pipeline_id,
            now,
            None if task_ids is None else frozenset(task_ids),
            None if exact is None else frozenset(exact),
            due,
        )

    @property
    def args(self) -> rules.ReleaseArgs:
        return (self.pipeline_id, self.now, self.task_ids, self.exact)

    def apply(self, book: DeviceBookings) -> DeviceBookings:
        return rules.release(book, [self.args])


@dataclass
class Stats:
    writes: int = 0
    cas_retries: int = 0
    conflicts: int = 0
    expired_dropped: int = 0
    evictions: int = 0
    #: Releases deferred; of them, carried by another write of their key, or written alone.
    releases_deferred: int = 0
    releases_carried: int = 0
    releases_flushed: int = 0
    #: Bookings refused because their key would pass the limit (`KeyFull`).
    full: int = 0
    #: Keys of departed devices deleted (`drop`).
    keys_dropped: int = 0


def last_expiry(windows: list[BookingWindow]) -> dict[str, float]:
    out: dict[str, float] = {}
    for w in windows:
        if w.expires > out.get(w.pipeline_id, -math.inf):
            out[w.pipeline_id] = w.expires
    return out


@dataclass(frozen=True)
class _FullKey:
    """A full key's value as planning here sees it (less deferred releases), with the
    expiry instants of its windows sorted, its preemptible windows, and the last expiry of
    each pipeline's windows."""

    base: Cached
    expiries: list[float]
    preemptible: list[BookingWindow]
    pipelines: dict[str, float]

    def makes_room(self, blocking: rules.Blocking, now: float) -> bool:
        """Whether a pipeline planning with `blocking` has live windows here to replace, or
        may evict some."""
        pid = blocking.pipeline_id
        if pid is not None and self.pipelines.get(pid, now) > now:
            return True
        return any(w.expires > now and blocking.evictable(w) for w in self.preemptible)


class BookingStore:
    def __init__(
        self,
        js: Any,
        *,
        bucket: str = BUCKET,
        history: int = 8,
        key_max_bytes: int = KEY_MAX_BYTES,
    ) -> None:
        self.js = js
        self.bucket = bucket
        self.history = history
        #: A booking never takes a key past this many bytes (`key_limit`).
        self.key_max_bytes = key_max_bytes
        self.kv: Any = None
        self.cache: dict[str, Cached] = {}
        #: Encoded size of each key's cached value, and the keys at or over the limit.
        self.sizes: dict[str, int] = {}
        self.full: dict[str, int] = {}
        #: Per full key: its value less deferred releases, with what `full_devices` looks at
        #: in it (made once per revision and release).
        self._full_keys: dict[str, _FullKey] = {}
        self.stats = Stats()
        self._watch_task: asyncio.Task[None] | None = None
        # one writer per key inside this process: CAS races are then only between replicas
        self._locks: dict[str, asyncio.Lock] = {}
        self._watcher: Any = None
        self.changed = asyncio.Event()
        #: Releases made but not written, per key, oldest first (`defer_release`).
        self._deferred: dict[str, list[Release]] = {}
        #: Each such key's value without them, made for the revision it holds.
        self._without: dict[str, Cached] = {}
        self._flusher: asyncio.Task[None] | None = None
        self._rewatching = asyncio.Lock()

    async def start(self) -> None:
        try:
            self.kv = await self.js.key_value(self.bucket)
        except BucketNotFoundError:
            with contextlib.suppress(Exception):  # a concurrent replica may create it first
                await self.js.create_key_value(
                    bucket=self.bucket, history=self.history, replicas=connect.js_replicas()
                )
            self.kv = await self.js.key_value(self.bucket)
        async with self._rewatching:  # a reconnect meanwhile waits for this watch
            await self._follow_anew()

    async def _follow_anew(self) -> None:
        """A new watch of the bucket: its current values applied (delete markers included),
        then followed; the one before, if any, stopped once the new one has caught up."""
        watcher = await self.kv.watchall()
        try:
            while (entry := await watcher.updates(timeout=5)) is not None:  # None: caught up
                self._apply(entry)
        except BaseException:
            with contextlib.suppress(Exception):
                await watcher.stop()
            raise
        old, old_task = self._watcher, self._watch_task
        self._watcher = watcher
        self._watch_task = asyncio.create_task(self._watch())
        if old_task is not None:
            old_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await old_task
        if old is not None:
            with contextlib.suppress(Exception):
                await old.stop()

    async def rewatch(self) -> None:
        """Watch again after a reconnect. The watch's ordered consumer finds out by itself
        that a restarted server lost it, but only after tens of seconds of missed heartbeats,
        and meanwhile other replicas' bookings would go
        unseen (CAS still refuses what overlaps them; planning would run into it)."""
        if self.kv is None:
            return
        async with self._rewatching:
            try:
                await self._follow_anew()
            except Exception as exc:  # the old watch still recovers by itself
                log.warning("watching the bookings again after a reconnect failed: %s", exc)

    async def stop(self, deadline: float | None = None) -> None:
        """Write the deferred releases (until `deadline`, event-loop time, at the latest: the
        windows left expire with their lease) and stop watching."""
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._flusher
        try:  # what ended is given back before this replica goes
            if not await eventloop.done_by(deadline, self.flush()):
                log.warning("stopping: deferred releases not all written in time (they expire)")
        except Exception as exc:
            log.warning("stopping: deferred releases not written (they expire): %s", exc)
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch_task
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher.stop()

    async def _watch(self) -> None:
        await follow(self._watcher, self._apply)

    def _apply(self, entry: Any) -> None:
        key = entry.key
        cur = self.cache.get(key)
        if cur is not None and cur.revision >= entry.revision:
            # we already know something newer (our own write's ack, or a refresh): a delete
            # marker too (a departed device's key dropped, then made again by a booking)
            return
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            self._forget(key)
            self.changed.set()
            return
        try:
            bk = decode(entry.value, DeviceBookings)
        except DecodeError as exc:
            log.warning(
                "ignoring undecodable booking %s rev %s: %s", key, entry.revision, exc.message
            )
            return
        self.cache[key] = Cached(entry.revision, bk)
        self._sized(key, len(entry.value))
        self.changed.set()

    def _lock(self, key: str) -> asyncio.Lock:
        """The key's writer lock in this process (CAS races are then only between replicas)."""
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def _forget(self, key: str) -> None:
        """The key is gone from the bucket (deleted, or never there)."""
        self.cache.pop(key, None)
        self._sized(key, 0)

    def _sized(self, key: str, size: int) -> None:
        if size:
            self.sizes[key] = size
        else:
            self.sizes.pop(key, None)
        if size >= self.key_max_bytes:
            if key not in self.full:
                log.warning(
                    "booking key %s is full (%d KiB, the limit is %d KiB): its device takes "
                    "no new bookings until windows are released or expire",
                    key, size // 1024, self.key_max_bytes // 1024,
                )  # fmt: skip
            self.full[key] = size
        elif self.full.pop(key, None) is not None:
            self._full_keys.pop(key, None)
            log.info("booking key %s takes bookings again (%d KiB)", key, size // 1024)

    def full_devices(self, now: float, room: rules.Blocking | None = None) -> dict[str, str]:
        """Devices (scheduler ids) whose key is at the limit with its live windows alone,
        each with why: planning leaves them alone until windows are released or expire. A
        key over the limit only with expired windows (or releases this replica has yet to
        write) is not full: the next booking's write drops them. With `room` (the planning
        pipeline's view), neither is a key where that pipeline may replace its own windows
        or evict some: its booking may fit, and the write decides (`KeyFull` if it grows)."""
        out = {}
        for key, size in self.full.items():
            cur = self.cache.get(key)
            if cur is None or not cur.book.windows:
                continue
            n = len(cur.book.windows)
            memo = self._full_key(key, cur)
            live = len(memo.expiries) - bisect.bisect_right(memo.expiries, now)
            if live * size < self.key_max_bytes * n:  # size in proportion to the windows
                continue
            if room is not None and memo.makes_room(room, now):
                continue
            out[device_of_key(key)] = full_reason(size * live // n, self.key_max_bytes, live)
        return out

    def _full_key(self, key: str, cur: Cached) -> _FullKey:
        base = self._released(key, cur)  # a new object for each revision and release
        memo = self._full_keys.get(key)
        if memo is None or memo.base is not base:
            windows = base.book.windows
            memo = self._full_keys[key] = _FullKey(
                base,
                sorted(w.expires for w in windows),
                [w for w in windows if w.preemptible],
                last_expiry(windows),
            )
        return memo

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Wait until `predicate` holds, looked at after each change of the cached bucket."""
        async with asyncio.timeout(timeout):
            while True:
                self.changed.clear()
                if predicate():
                    return
                await self.changed.wait()

    def snapshot(self) -> dict[str, Cached]:
        """The cached bookings (no network), less the releases not written yet; may be
        slightly stale, CAS catches that."""
        snap = dict(self.cache)
        for key in self._deferred:
            cur = snap.get(key)
            if cur is not None:
                snap[key] = self._released(key, cur)
        return snap

    def _released(self, key: str, cur: Cached) -> Cached:
        """`cur` less the key's deferred releases (made once per revision and release)."""
        todo = self._deferred.get(key)
        if not todo:
            return cur
        memo = self._without.get(key)
        if memo is not None and memo.revision == cur.revision:
            return memo
        book = rules.release(cur.book, [r.args for r in todo])
        out = self._without[key] = Cached(cur.revision, book)
        return out

    def defer_release(
        self,
        key: str,
        pipeline_id: str,
        now: float,
        task_ids: Collection[str] | None = None,
        exact: Collection[tuple[str, float, float]] | None = None,
        after_s: float = RELEASE_FLUSH_S,
    ) -> None:
        """`release`, written with this process's next write of the key (a booking, a renewal)
        or alone `after_s` later, whichever comes first. Planning here sees the windows gone
        at once; other replicas when it is written. Under load most keys are booked again
        within that time, so most releases cost no write of their own."""
        due = asyncio.get_running_loop().time() + after_s
        rel = Release.of(pipeline_id, now, task_ids, exact, due)
        todo = self._deferred.setdefault(key, [])
        if task_ids is None and exact is None and todo:  # all of the pipeline's: its earlier
            rel = replace(rel, due=_due(todo))  # ones go, keeping the key's due
            todo[:] = [r for r in todo if r.pipeline_id != pipeline_id]
        todo.append(rel)
        memo, cur = self._without.get(key), self.cache.get(key)
        if memo is not None and cur is not None and memo.revision == cur.revision:
            self._without[key] = Cached(memo.revision, rel.apply(memo.book))  # one more step
        else:
            self._without.pop(key, None)
        self.stats.releases_deferred += 1
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_later())

    async def _flush_later(self) -> None:
        """Write each key's releases when its oldest is due: as spread out in time as the
        pipelines that made them, not all at once (a burst of writes delays placements)."""
        loop = asyncio.get_running_loop()
        while self._deferred:
            first = min(_due(todo) for todo in self._deferred.values())
            await asyncio.sleep(max(0.0, first - loop.time()))
            if not await self.flush(due_by=loop.time()):
                await asyncio.sleep(RELEASE_FLUSH_S)  # the bucket refused: not in a tight loop

    async def flush(self, due_by: float | None = None) -> bool:
        """Write the deferred releases (those of keys whose oldest is due by `due_by`; all
        without it), one write per key; False when a write failed: its releases stay
        deferred (their windows expire meanwhile in any case)."""
        for key in [k for k in self._deferred if k not in self.cache]:
            self._carried(key, tuple(self._deferred[key]), True)  # no windows: none to give
        keys = sorted(
            k for k, todo in self._deferred.items() if due_by is None or _due(todo) <= due_by
        )
        done = await asyncio.gather(
            *(self.transact(k, _unchanged, flushing=True) for k in keys), return_exceptions=True
        )
        ok = True
        for k, r in zip(keys, done, strict=True):
            if isinstance(r, BaseException):
                ok = False
                log.warning("release on %s not written (tried again later): %s", k, r)
        return ok

    def _carried(self, key: str, done: tuple[Release, ...], flushing: bool) -> None:
        """These deferred releases of `key` are written (or had nothing left to release)."""
        if not done:
            return
        todo = [r for r in self._deferred.get(key, ()) if not any(r is d for d in done)]
        gone = len(self._deferred.get(key, ())) - len(todo)
        if flushing:
            self.stats.releases_flushed += gone
        else:
            self.stats.releases_carried += gone
        self._without.pop(key, None)
        if todo:
            self._deferred[key] = todo
        else:
            self._deferred.pop(key, None)

    async def refresh(self, key: str) -> Cached | None:
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            self._forget(key)
            return None
        if entry.value:
            self._apply(entry)
        return self.cache.get(key)

    async def _write(self, key: str, cur: Cached | None, new: DeviceBookings, data: bytes) -> int:
        rev = await (
            self.kv.create(key, data)
            if cur is None
            else self.kv.update(key, data, last=cur.revision)
        )
        self.stats.writes += 1
        self.cache[key] = Cached(int(rev), new)
        self._sized(key, len(data))
        self.changed.set()
        return int(rev)

    def _step(
        self, key: str, cur: Cached | None, fn: Callable[[DeviceBookings], rules.AddResult]
    ) -> Prepared:
        """`fn` on the value `cur` less the key's deferred releases, and what to write for it
        (None: refused, or unchanged)."""
        released = tuple(self._deferred.get(key, ()))  # none has a window left when cur is None
        base = self._released(key, cur) if cur is not None else None
        res = fn(base.book if base is not None else DeviceBookings(device=key))
        unchanged = cur is not None and res.book == cur.book
        data = encode(res.book) if res.ok and not unchanged else None
        return Prepared(cur, res, data, released)

    def prepare(self, key: str, fn: Callable[[DeviceBookings], rules.AddResult]) -> Prepared:
        """`transact`'s first step on the cached value, now: CPU a caller can spend while it
        waits for something else; `transact` writes it as made if the key has not moved."""
        return self._step(key, self.cache.get(key), fn)

    async def transact(
        self,
        key: str,
        fn: Callable[[DeviceBookings], rules.AddResult],
        prepared: Prepared | None = None,
        *,
        flushing: bool = False,
    ) -> tuple[rules.AddResult, int, int]:
        """Apply `fn` to the key's current windows and write the result by CAS, re-reading
        and re-applying on a lost race. Returns (result, new revision or 0, CAS retries);
        a key still contended after CAS_RETRIES tries comes back as a conflict. `prepared`
        (from `prepare` with the same `fn`) stands for the first step if the key has not
        changed since."""
        async with self._lock(key):
            return await self._transact(key, fn, prepared, flushing)

    async def _transact(
        self,
        key: str,
        fn: Callable[[DeviceBookings], rules.AddResult],
        prepared: Prepared | None = None,
        flushing: bool = False,
    ) -> tuple[rules.AddResult, int, int]:
        cur = self.cache.get(key)
        retries = 0
        for attempt in range(CAS_RETRIES):
            if attempt:
                # another replica won the race: back off a little, with jitter
                await asyncio.sleep(random.uniform(0.0, 0.002 * 2**attempt))
            step = prepared if prepared is not None and prepared.base is cur else None
            step = step or self._step(key, cur, fn)
            prepared = None
            res = step.result
            if not res.ok:
                return res, 0, retries
            if step.data is None:  # nothing to write (the deferred releases had nothing left)
                self._carried(key, step.released, flushing)
                return res, cur.revision if cur is not None else 0, retries
            size = len(step.data)
            if size > self.key_max_bytes and size > self.sizes.get(key, 0):
                # only a write that grows the key is refused: a renewal or a release of a
                # key already past a (lowered) limit still goes through
                raise KeyFull(key, size, self.key_max_bytes, len(res.book.windows))
            try:
                rev = await self._write(key, cur, res.book, step.data)
                self.stats.expired_dropped += res.expired
                self._carried(key, step.released, flushing)
                return res, rev, retries
            except KeyWrongLastSequenceError:
                retries += 1
                self.stats.cas_retries += 1
                cur = await self.refresh(key)
        log.warning("booking %s: still losing the CAS race after %d tries", key, CAS_RETRIES)
        base = cur.book if cur is not None else DeviceBookings(device=key)
        return rules.AddResult(False, base), 0, retries

    @staticmethod
    def booking(
        windows: list[BookingWindow],
        now: float,
        may_evict: Callable[[BookingWindow], bool] = lambda _w: False,
        moving: Collection[tuple[str, str]] = (),
    ) -> Callable[[DeviceBookings], rules.AddResult]:
        """What `book` applies to a key's windows (for `prepare`; `rules.add`)."""
        return lambda b: rules.add(b, windows, now, may_evict, moving)

    async def book(
        self,
        key: str,
        windows: list[BookingWindow],
        now: float,
        may_evict: Callable[[BookingWindow], bool] = lambda _w: False,
        prepared: Prepared | None = None,
        moving: Collection[tuple[str, str]] = (),
    ) -> BookResult:
        """Book `windows` on `key` by CAS; `prepared`: from `prepare(key, booking(...))` with
        the same arguments."""
        try:
            res, rev, retries = await self.transact(
                key, self.booking(windows, now, may_evict, moving), prepared
            )
        except KeyFull as exc:
            self.stats.full += 1
            return BookResult(False, key, full=exc.reason)
        if not res.ok:
            self.stats.conflicts += 1
            return BookResult(False, key, conflicts=res.conflicts, cas_retries=retries)
        self.stats.evictions += len(res.evicted)
        return BookResult(True, key, rev, evicted=res.evicted, cas_retries=retries)

    def keys_holding(self, pipeline_id: str) -> list[str]:
        """Keys whose cached value holds a window of `pipeline_id` (a walk over every
        window: for a pipeline changing hands, not for a placement)."""
        return sorted(
            key for key, cur in self.cache.items()
            if any(w.pipeline_id == pipeline_id for w in cur.book.windows)
        )  # fmt: skip

    def stale_keys(self, now: float, live: Collection[str]) -> list[str]:
        """Keys whose every window has expired, with no release of this replica's waiting,
        of devices not in `live` (scheduler ids): what a departed device leaves behind."""
        return sorted(
            key
            for key, cur in self.cache.items()
            if key not in self._deferred
            and device_of_key(key) not in live
            and all(w.expires <= now for w in cur.book.windows)
        )

    async def drop(self, keys: Collection[str]) -> int:
        """Delete these keys, each only at the revision cached here (a write since, by any
        replica, keeps it); how many went. A device's next booking creates its key again,
        on a revision above every earlier one (revisions count the whole bucket)."""
        dropped = 0
        for key in keys:
            cur = self.cache.get(key)
            if cur is None:
                continue
            async with self._lock(key):
                if self.cache.get(key) is not cur:
                    continue  # written meanwhile
                try:
                    await self.kv.delete(key, last=cur.revision)
                except (KeyWrongLastSequenceError, BadRequestError) as exc:
                    # nats-py's delete reports a CAS miss as a bad request, code 10071
                    if getattr(exc, "err_code", WRONG_LAST_SEQUENCE) != WRONG_LAST_SEQUENCE:
                        raise
                    continue
                if self.cache.get(key) is cur:
                    self._forget(key)
            dropped += 1
        self.stats.keys_dropped += dropped
        return dropped

    async def release(
        self,
        key: str,
        pipeline_id: str,
        now: float,
        task_ids: list[str] | None = None,
        exact: Collection[tuple[str, float, float]] | None = None,
    ) -> int:
        """Give the pipeline's windows on `key` back (see `book.release`); nothing is written
        when none is there."""

        rel = Release.of(pipeline_id, now, task_ids, exact)
        return (await self.transact(key, lambda b: rules.AddResult(True, rel.apply(b))))[1]

    async def hold(
        self, key: str, pipeline_id: str, task_id: str, start: float, end: float
    ) -> bool:
        """Make a started task's window non-preemptible (`book.hold`); whether this write made
        it so (False: it is gone, or already firm, and nothing of it was written)."""
        changed = False

        def fn(b: DeviceBookings) -> rules.AddResult:
            nonlocal changed  # of the last try: a lost CAS race applies it again
            held = rules.hold(b, pipeline_id, task_id, start, end)
            changed = held is not b
            return rules.AddResult(True, held)

        return (await self.transact(key, fn))[1] > 0 and changed

    async def renew(self, key: str, pipeline_ids: set[str], expires: float, now: float) -> int:
        def fn(b: DeviceBookings) -> rules.AddResult:
            return rules.AddResult(True, rules.renew(b, pipeline_ids, expires, now))

        return (await self.transact(key, fn))[1]
