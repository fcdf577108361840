"""The orchestrator's watched copy of the bookings follows other writers again soon after a
nats-server restart (over a real, restarted nats-server)."""

from __future__ import annotations

import asyncio

import nats
import pytest

from orchestrator.infra.natsserver import EmbeddedNats
from orchestrator.reservations.store import BUCKET
from orchestrator.service import Orchestrator
from schemas.bookings import DeviceBookings
from schemas.codec import encode

pytestmark = pytest.mark.integration

#: The watch's ordered consumer notices a lost server by itself only after ~20 s of missed
#: heartbeats; watched again on reconnect, another writer's key is seen well within this.
SEEN_WITHIN_S = 8.0


async def put(url: str, key: str) -> None:
    """Another replica's write: a key of its own."""
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(BUCKET)
        await kv.put(key, encode(DeviceBookings(device=key)))
    finally:
        await nc.close()


async def test_other_writers_are_seen_soon_after_a_server_restart(
    nats_server: EmbeddedNats,
) -> None:
    url = nats_server.url
    orch = Orchestrator(url)
    await orch.start()
    try:
        await put(url, "dev.before.cpu0")
        await orch.store.wait_until(lambda: "dev.before.cpu0" in orch.store.cache, 5.0)
        await asyncio.to_thread(nats_server.stop)
        await asyncio.to_thread(nats_server.start)
        await put(url, "dev.after.cpu0")
        await orch.store.wait_until(lambda: "dev.after.cpu0" in orch.store.cache, SEEN_WITHIN_S)
        assert "dev.before.cpu0" in orch.store.cache
        # and it goes on following them: one watch, not one per reconnect
        await put(url, "dev.later.cpu0")
        await orch.store.wait_until(lambda: "dev.later.cpu0" in orch.store.cache, 5.0)
    finally:
        await orch.stop()
