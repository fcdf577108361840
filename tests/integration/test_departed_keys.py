"""Booking keys of departed devices are deleted once every window on them has expired, only
at the revision read (over a real nats-server)."""

from __future__ import annotations

import time

import nats
import pytest
from nats.js.errors import KeyNotFoundError

from orchestrator.reservations.store import BUCKET, BookingStore, Cached
from orchestrator.service import Orchestrator
from schemas.bookings import BookingWindow, DeviceBookings
from schemas.codec import encode
from tests.harness import one_device_agent

pytestmark = pytest.mark.integration


def book(key: str, *expires: float) -> DeviceBookings:
    now = time.time()
    return DeviceBookings(device=key, windows=[
        BookingWindow(pipeline_id=f"p{i}", task_id="t", slot=0, start=now - 60 + i,
                      end=now - 59 + i, expires=e, owner="gone")
        for i, e in enumerate(expires)
    ])  # fmt: skip


async def test_departed_devices_keys_go_once_their_windows_expired(nats_url: str) -> None:
    orch = Orchestrator(nats_url)
    await orch.start()
    agent = await one_device_agent(nats_url, "a1")
    nc = await nats.connect(nats_url)
    try:
        assert await orch.wait_for_agents(1, timeout=10.0) == 1
        kv = await nc.jetstream().key_value(BUCKET)
        now = time.time()
        keys = {
            "dev.gone.cpu0": book("dev.gone.cpu0", now - 5, now - 1),  # goes
            "dev.gone2.cpu0": book("dev.gone2.cpu0"),  # empty: goes
            "dev.gone.gpu0": book("dev.gone.gpu0", now - 5, now + 600),  # a live window: stays
            "dev.a1.cpu0": book("dev.a1.cpu0", now - 5),  # a live agent's: stays
        }
        revs = {k: int(await kv.put(k, encode(v))) for k, v in keys.items()}
        await orch.store.wait_until(lambda: all(k in orch.store.cache for k in keys), timeout=10.0)
        assert await orch.drop_departed() == 2
        for gone in ("dev.gone.cpu0", "dev.gone2.cpu0"):
            with pytest.raises(KeyNotFoundError):
                await kv.get(gone)
            assert gone not in orch.store.cache
        for kept in ("dev.gone.gpu0", "dev.a1.cpu0"):
            assert (await kv.get(kept)).revision == revs[kept]
        assert await orch.drop_departed() == 0
        # the device comes back: its next booking makes the key again, on a newer revision
        w = BookingWindow(pipeline_id="new", task_id="t", slot=0, start=now, end=now + 1,
                          expires=now + 60, owner=orch.owner)  # fmt: skip
        again = await orch.store.book("dev.gone.cpu0", [w], now)
        assert again.ok and again.token > max(revs.values())
        assert (await kv.get("dev.gone.cpu0")).revision == again.token
    finally:
        await nc.close()
        await agent.stop()
        await orch.stop()


async def test_a_key_written_since_it_was_read_is_kept(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.create_key_value(bucket=BUCKET, history=8)
        kv = await js.key_value(BUCKET)
        now = time.time()
        old = book("dev.gone.cpu0", now - 5)
        first = int(await kv.put("dev.gone.cpu0", encode(old)))
        await kv.put("dev.gone.cpu0", encode(book("dev.gone.cpu0", now - 4)))  # another replica
        store = BookingStore(js)  # its copy still at the first revision (not watching)
        store.kv = kv
        store.cache["dev.gone.cpu0"] = Cached(first, old)
        assert store.stale_keys(now, live=set()) == ["dev.gone.cpu0"]
        assert await store.drop(["dev.gone.cpu0"]) == 0
        assert (await kv.get("dev.gone.cpu0")).revision == first + 1
    finally:
        await nc.close()
