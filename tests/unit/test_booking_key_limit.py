"""The device of a booking key, and what `mars agents` shows of the windows booked."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from console.cli import agent_line
from orchestrator.reservations.book import Blocking
from orchestrator.reservations.store import (
    BookingStore,
    Cached,
    device_key,
    device_key_of,
    device_of_key,
)
from schemas.api import AgentSummary, DeviceQueue
from schemas.bookings import BookingWindow, DeviceBookings
from schemas.codec import encode
from tests.unit.offline_store import offline_store

IDENT = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-",
    min_size=1,
    max_size=40,
)


@given(IDENT, IDENT)
def test_a_keys_device_is_the_device_it_was_made_for(agent: str, dev: str) -> None:
    key = device_key(agent, dev)
    assert device_of_key(key) == f"{agent}:{dev}"
    assert device_key_of(device_of_key(key)) == key


def test_mars_agents_shows_the_windows_booked_and_a_full_device() -> None:
    a = AgentSummary(
        agent_id="edge-1", incarnation="i1", site="s1", tier="edge", alive=True,
        devices=["cpu0:cpu", "gpu0:gpu", "npu0:npu"], running=2,
        queues=[
            DeviceQueue(device_id="cpu0", windows=1500, key_bytes=262_000, full=True),
            DeviceQueue(device_id="gpu0", windows=3, key_bytes=600),
            DeviceQueue(device_id="npu0", windows=0, key_bytes=40),
        ],
    )  # fmt: skip
    line = agent_line(a)
    assert line.endswith(" booked=cpu0:1500(FULL, 255 KiB),gpu0:3")
    assert "running=2 devices=cpu0:cpu,gpu0:gpu,npu0:npu" in line
    assert "booked=" not in agent_line(a.model_copy(update={"queues": []}))


def test_a_key_is_full_with_its_live_windows_alone() -> None:
    """Expired windows and this replica's releases not yet written stay in a key until its
    next write; they do not make its device full (and the answer follows each release)."""

    async def run() -> None:
        async with offline_store(key_max_bytes=600) as store:
            key = "dev.a.cpu0"
            book = DeviceBookings(device=key, windows=[
                BookingWindow(pipeline_id=p, task_id=f"t{i}", slot=0, start=100.0 * j + i,
                              end=100.0 * j + i + 0.5, expires=expires, owner="o")
                for j, (p, expires) in enumerate((("p0", 50.0), ("p1", 1e9)))
                for i in range(10)
            ])  # fmt: skip
            store.cache[key] = Cached(1, book)
            store._sized(key, 1000)  # 20 windows in 1,000 bytes: 50 each, 600 allowed
            assert store.full_devices(now=10.0).keys() == {"a:cpu0"}
            # p0's ten expire at 50: 500 bytes of them would be left
            assert store.full_devices(now=60.0) == {}
            store.defer_release(key, "p1", 10.0, task_ids=[f"t{i}" for i in range(5)])
            assert store.full_devices(now=10.0).keys() == {"a:cpu0"}  # 15 left: 750 bytes
            store.defer_release(key, "p1", 10.0)
            assert store.full_devices(now=10.0) == {}  # 10 left: 500 bytes

    asyncio.run(run())


def test_a_full_key_is_left_in_for_a_pipeline_that_may_make_room_there() -> None:
    """Full for a pipeline that can only add to the key; not for one with live windows of
    its own there (it books them again in place) or one that may evict some."""

    async def run() -> None:
        async with offline_store(key_max_bytes=600) as store:
            key = "dev.a.cpu0"
            kinds = [("low", True, 1e9), ("late", True, 50.0), ("f1", False, 1e9),
                     ("f2", False, 1e9)]  # fmt: skip
            book = DeviceBookings(device=key, windows=[
                BookingWindow(pipeline_id=p, task_id=f"t{i}", slot=0, start=100.0 * j + i,
                              end=100.0 * j + i + 0.5, expires=expires, owner="o",
                              priority=10, preemptible=pre)
                for j, (p, pre, expires) in enumerate(kinds)
                for i in range(10)
            ])  # fmt: skip
            store.cache[key] = Cached(1, book)
            store._sized(key, 2000)  # 40 windows, 50 bytes each, 600 allowed
            full = {"a:cpu0"}

            def seen(pipeline: str, priority: int, now: float) -> set[str]:
                return set(store.full_devices(now, room=Blocking(pipeline, priority, now)))

            assert seen("new", 10, 10.0) == full  # evicts nothing of the same priority
            assert seen("new", 500, 10.0) == set()  # may evict "low" and "late"
            assert seen("f1", 10, 10.0) == set()  # books its own windows again
            assert seen("late", 10, 60.0) == full  # its own windows there have expired
            assert seen("new", 500, 60.0) == set()  # "low" is still there to evict
            store.defer_release(key, "low", 60.0)  # given back: nothing left to evict
            assert seen("new", 500, 60.0) == full
            assert store.full_devices(60.0).keys() == full

    asyncio.run(run())


@dataclass
class Entry:
    """What the watch hands the store (nats-py's KeyValue.Entry, the fields it reads)."""

    key: str
    revision: int
    value: bytes | None
    operation: str | None = None


def test_a_delete_marker_older_than_the_cached_value_is_ignored() -> None:
    """A departed device's key dropped, then made again by a booking whose ack came before
    the watch brought the delete: the new value stays."""
    store = BookingStore(js=None)
    key = "dev.a.cpu0"
    made = DeviceBookings(device=key)
    store.cache[key] = Cached(12, made)
    store._apply(Entry(key, 11, None, "DEL"))
    assert store.cache[key].revision == 12
    store._apply(Entry(key, 13, None, "DEL"))  # a newer delete does remove it
    assert key not in store.cache
    store._apply(Entry(key, 14, encode(made)))
    assert store.cache[key] == Cached(14, made) and store.sizes[key] == len(encode(made))
