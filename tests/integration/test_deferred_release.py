"""A deferred release (`BookingStore.defer_release`) is gone from this replica's planning view
at once, goes to the bucket with the key's next write, or alone soon after, and is written
before the store stops; over a real nats-server, read back from the bucket."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import nats
import pytest

from orchestrator.reservations.store import RELEASE_FLUSH_S, BookingStore
from schemas.bookings import BookingWindow, DeviceBookings
from schemas.codec import decode

pytestmark = pytest.mark.integration


def window(pid: str, start: float, now: float, task: str = "t") -> BookingWindow:
    return BookingWindow(pipeline_id=pid, task_id=task, slot=0, start=now + start,
                         end=now + start + 1.0, expires=now + 30.0, owner=pid)  # fmt: skip


async def stored(store: BookingStore, key: str) -> list[str]:
    """Pipelines holding windows on `key` in the bucket itself."""
    got = decode((await store.kv.get(key)).value, DeviceBookings)
    return sorted(f"{w.pipeline_id}/{w.task_id}" for w in got.windows)


def planned(store: BookingStore, key: str) -> list[str]:
    """Pipelines holding windows on `key` as planning here sees it."""
    return sorted(f"{w.pipeline_id}/{w.task_id}" for w in store.snapshot()[key].book.windows)


@pytest.fixture
async def store(nats_url: str) -> AsyncIterator[BookingStore]:
    nc = await nats.connect(nats_url)
    bookings = BookingStore(nc.jetstream())
    await bookings.start()
    try:
        yield bookings
    finally:
        await bookings.stop()
        await nc.close()


async def test_a_deferred_release_rides_the_next_write_or_goes_alone(store: BookingStore) -> None:
    busy, quiet, now = "dev.a.cpu0", "dev.b.cpu0", time.time()
    assert (await store.book(busy, [window("p1", 0.0, now)], now)).ok
    assert (await store.book(quiet, [window("p1", 0.0, now)], now)).ok
    writes = store.stats.writes
    t0 = time.monotonic()
    store.defer_release(busy, "p1", now)
    store.defer_release(quiet, "p1", now)
    # planning here sees both devices free at once; the bucket does not yet
    assert planned(store, busy) == []
    assert planned(store, quiet) == []
    assert await stored(store, busy) == ["p1/t"] and await stored(store, quiet) == ["p1/t"]
    # the next booking of `busy` carries its release: one write, not two
    assert (await store.book(busy, [window("p2", 0.5, now)], now)).ok
    assert store.stats.writes == writes + 1
    assert await stored(store, busy) == ["p2/t"]
    assert store.stats.releases_carried == 1 and store.stats.releases_flushed == 0
    # `quiet` is not written again: its release goes alone, RELEASE_FLUSH_S later
    await store.wait_until(lambda: store.stats.releases_flushed == 1, 10.0)
    assert time.monotonic() - t0 >= RELEASE_FLUSH_S
    assert await stored(store, quiet) == [] and await stored(store, busy) == ["p2/t"]
    assert store.stats.writes == writes + 2
    # a release deferred while a booking was worked out ahead is not lost with it
    ahead = store.prepare(busy, store.booking([window("p3", 2.0, now)], now))
    store.defer_release(busy, "p2", now)
    assert (await store.book(busy, [window("p3", 2.0, now)], now, prepared=ahead)).ok
    assert await stored(store, busy) == ["p2/t", "p3/t"]  # written as prepared
    assert planned(store, busy) == ["p3/t"]  # p2's release is still to go
    # ...and what is still deferred when the store stops is written before it goes
    await store.stop()
    assert await stored(store, busy) == ["p3/t"]


async def test_releases_are_written_when_due_not_all_at_once(store: BookingStore) -> None:
    early, late, now = "dev.a.cpu0", "dev.b.cpu0", time.time()
    for key in (early, late):
        assert (await store.book(key, [window("p1", 0.0, now)], now)).ok
    loop = asyncio.get_running_loop()
    store.defer_release(early, "p1", now)
    store.defer_release(late, "p1", now, after_s=60.0)  # made to fall due much later
    # what is due by then is written; the other waits for its own time
    assert await store.flush(due_by=loop.time() + RELEASE_FLUSH_S)
    assert await stored(store, early) == [] and await stored(store, late) == ["p1/t"]
    assert store.stats.releases_flushed == 1
    assert await store.flush()
    assert await stored(store, late) == [] and store.stats.releases_flushed == 2
