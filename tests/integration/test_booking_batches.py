"""Bookings on several devices as one atomic batch, over a real nats-server: one write for all
the keys when the cached revisions hold, nothing of the batch when one does not (and then key
by key, as before), revisions that are the keys' real revisions (fencing tokens)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NATS

from orchestrator.reservations import batch
from orchestrator.reservations.store import BookingStore
from schemas.bookings import BookingWindow


def window(pid: str, task: str, start: float, end: float, now: float) -> BookingWindow:
    return BookingWindow(
        pipeline_id=pid, task_id=task, slot=0, start=start, end=end, expires=now + 30,
        owner="test",
    )  # fmt: skip


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()


async def started(nc: NATS, *, batches: bool = True) -> BookingStore:
    store = BookingStore(nc.jetstream(), nc=nc if batches else None)
    await store.start()
    return store


async def revision(nc: NATS, key: str) -> int:
    kv = await nc.jetstream().key_value("MARS_BOOKINGS")
    rev = (await kv.get(key)).revision
    assert rev is not None
    return rev


async def test_several_keys_are_booked_in_one_batch_with_their_real_revisions(nc: NATS) -> None:
    store = await started(nc)
    try:
        assert store.batches  # this server keeps allow_atomic on the bucket's stream
        now = time.time()
        by_key = {f"dev.a{i}.cpu0": [window("p", f"t{i}", now + 1, now + 2, now)] for i in range(3)}
        results = await store.book_many(by_key, now)
        assert [r.key for r in results] == sorted(by_key) and all(r.ok for r in results)
        assert store.stats.batches == 1 and store.stats.batch_fallbacks == 0
        assert store.stats.writes == 3
        tokens = [r.token for r in results]
        assert tokens == [await revision(nc, k) for k in sorted(by_key)]
        assert len(set(tokens)) == 3 and min(tokens) > 0
        assert all(store.cache[r.key].revision == r.token for r in results)
        # given back the same way
        revs = await store.release_many(sorted(by_key), "p", now)
        assert store.stats.batches == 2
        now_at = {k: await revision(nc, k) for k in revs}
        assert revs == now_at and min(revs.values()) > tokens[-1]
        assert all(store.cache[k].book.windows == [] for k in by_key)
    finally:
        await store.stop()


async def test_a_batch_with_one_stale_key_writes_nothing_and_falls_back(nc: NATS) -> None:
    mine = await started(nc)
    other = await started(nc, batches=False)
    try:
        now = time.time()
        keys = ["dev.a.cpu0", "dev.b.cpu0"]
        await mine.book_many({k: [window("seed", "s", now + 5, now + 6, now)] for k in keys}, now)
        before = {k: await revision(nc, k) for k in keys}
        # Our store stops following the bucket: its view of b goes stale when another replica
        # books there (not overlapping ours), so the batch must be refused as a whole.
        await mine.stop()
        assert (await other.book("dev.b.cpu0", [window("q", "x", now + 3, now + 4, now)], now)).ok
        moved_b = await revision(nc, "dev.b.cpu0")
        results = await mine.book_many(
            {k: [window("p", "t", now + 1, now + 2, now)] for k in keys}, now
        )
        assert all(r.ok for r in results)
        assert mine.stats.batch_fallbacks == 1 and mine.stats.batches == 1  # the seed's only
        a, b = results
        assert a.cas_retries == 0 and b.cas_retries == 1  # only b was re-read
        assert a.token == await revision(nc, "dev.a.cpu0") > before["dev.a.cpu0"]
        assert b.token == await revision(nc, "dev.b.cpu0") > moved_b
        # the refused batch left nothing behind: a holds the seed and p, b also q
        info = await nc.jetstream().stream_info("KV_MARS_BOOKINGS", subjects_filter=">")
        assert info.state.subjects == {"$KV.MARS_BOOKINGS.dev.a.cpu0": 2,
                                       "$KV.MARS_BOOKINGS.dev.b.cpu0": 3}  # fmt: skip
        booked_b = {w.pipeline_id for w in mine.cache["dev.b.cpu0"].book.windows}
        assert booked_b == {"seed", "q", "p"}  # the other replica's window was kept
    finally:
        await other.stop()


async def test_a_real_overlap_is_a_conflict_on_that_key_only(nc: NATS) -> None:
    store = await started(nc)
    try:
        now = time.time()
        await store.book("dev.b.cpu0", [window("q", "x", now + 1, now + 3, now)], now)
        writes = store.stats.writes
        results = await store.book_many(
            {
                "dev.a.cpu0": [window("p", "t1", now + 1, now + 2, now)],
                "dev.b.cpu0": [window("p", "t2", now + 2, now + 4, now)],
                "dev.c.cpu0": [window("p", "t3", now + 1, now + 2, now)],
            },
            now,
        )
        ok = {r.key: r.ok for r in results}
        assert ok == {"dev.a.cpu0": True, "dev.b.cpu0": False, "dev.c.cpu0": True}
        assert [w.task_id for w in results[1].conflicts] == ["x"]
        assert store.stats.writes == writes + 2 and store.stats.batches == 1
    finally:
        await store.stop()


async def test_the_batch_writer_refuses_what_the_server_would(nc: NATS) -> None:
    store = await started(nc)
    try:
        with pytest.raises(ValueError):
            await batch.write(nc, "MARS_BOOKINGS", [])
        with pytest.raises(ValueError):
            await batch.write(nc, "MARS_BOOKINGS", [("k", b"1", 0), ("k", b"2", 0)])
        # a create of a key that exists fails the whole batch: the new key is not written
        await batch.write(nc, "MARS_BOOKINGS", [("dev.x.cpu0", b"\x80", 0)])
        with pytest.raises(batch.BatchFailed) as err:
            await batch.write(
                nc, "MARS_BOOKINGS", [("dev.y.cpu0", b"\x80", 0), ("dev.x.cpu0", b"\x80", 0)]
            )
        assert err.value.err_code == 10071  # wrong last sequence
        kv = await nc.jetstream().key_value("MARS_BOOKINGS")
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await kv.get("dev.y.cpu0")
    finally:
        await store.stop()
