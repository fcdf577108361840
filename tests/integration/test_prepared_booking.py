"""A booking worked out ahead of its write (`BookingStore.prepare`, made while a new
pipeline's ownership claim is on its way) is written as it is only if its key did not move
meanwhile; otherwise it is worked out again on the key's new value, over a real nats-server."""

from __future__ import annotations

import time

import nats
import pytest

from orchestrator.reservations.store import BookingStore
from schemas.bookings import BookingWindow, DeviceBookings
from schemas.codec import decode

pytestmark = pytest.mark.integration


def window(pid: str, start: float, now: float, slot: int = 0) -> BookingWindow:
    return BookingWindow(pipeline_id=pid, task_id="t", slot=slot, start=now + start,
                         end=now + start + 1.0, expires=now + 30.0, owner=pid)  # fmt: skip


async def test_a_prepared_booking_is_written_as_made_or_made_again(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    mine, other = BookingStore(nc.jetstream()), BookingStore(nc.jetstream())
    await mine.start()
    await other.start()
    key, now = "dev.a.cpu0", time.time()
    try:
        # unchanged since: the payload made ahead is what is written
        ahead = mine.prepare(key, mine.booking([window("p1", 0.0, now)], now))
        assert ahead.base is None and ahead.data is not None
        done = await mine.book(key, [window("p1", 0.0, now)], now, prepared=ahead)
        assert done.ok and done.token > 0 and done.cas_retries == 0
        assert (await mine.kv.get(key)).value == ahead.data
        # another replica books the key between the two: the prepared value would drop its
        # window, so it is worked out again (one CAS lost, nothing lost)
        ahead = mine.prepare(key, mine.booking([window("p2", 2.0, now)], now))
        assert (await other.book(key, [window("p3", 4.0, now)], now)).ok
        done = await mine.book(key, [window("p2", 2.0, now)], now, prepared=ahead)
        assert done.ok
        got = decode((await mine.kv.get(key)).value, DeviceBookings)
        assert sorted(w.pipeline_id for w in got.windows) == ["p1", "p2", "p3"]
        # ...and a conflict the key's new value brings is found, not written over
        ahead = mine.prepare(key, mine.booking([window("p4", 6.0, now)], now))
        assert (await other.book(key, [window("p5", 6.5, now)], now)).ok
        await mine.refresh(key)  # this replica has seen it (its watch would tell it too)
        clash = await mine.book(key, [window("p4", 6.0, now)], now, prepared=ahead)
        assert not clash.ok and [w.pipeline_id for w in clash.conflicts] == ["p5"]
        assert clash.cas_retries == 0  # seen moved before writing: no CAS sent to lose
    finally:
        await mine.stop()
        await other.stop()
        await nc.close()


async def test_holding_a_window_says_whether_it_made_it_firm(nats_url: str) -> None:
    """`hold` is true only for the write that made the window firm: not for a window already
    firm, nor for one another replica took meanwhile (its cached copy still shows it)."""
    nc = await nats.connect(nats_url)
    mine, other = BookingStore(nc.jetstream()), BookingStore(nc.jetstream())
    await mine.start()
    await other.start()
    key, now = "dev.a.cpu0", time.time()
    low = window("low", 0.0, now).model_copy(update={"preemptible": True, "priority": 10})
    try:
        assert (await mine.book(key, [low], now)).ok
        firm = await mine.hold(key, "low", "t", low.start, low.end)
        assert firm and not await mine.hold(key, "low", "t", low.start, low.end)
        got = decode((await mine.kv.get(key)).value, DeviceBookings)
        assert [(w.pipeline_id, w.preemptible) for w in got.windows] == [("low", False)]
        # a second window, taken by another replica before this one's cache has heard of it
        low2 = window("low2", 2.0, now).model_copy(update={"preemptible": True, "priority": 10})
        assert (await mine.book(key, [low2], now)).ok
        await other.refresh(key)
        high = window("high", 2.0, now).model_copy(update={"priority": 500})
        took = await other.book(key, [high], now, may_evict=lambda w: w.preemptible)
        assert took.ok and [w.pipeline_id for w in took.evicted] == ["low2"]
        assert not await mine.hold(key, "low2", "t", low2.start, low2.end)  # gone: not held
    finally:
        await mine.stop()
        await other.stop()
        await nc.close()
