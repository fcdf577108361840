"""A device's booking key has a size limit: planning leaves a full device alone, a booking
that would pass the limit is refused and re-planned elsewhere, and a pipeline with nowhere
else to go is refused with that reason. Over a real nats-server."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import nats
import pytest
from nats.aio.client import Client as NATS

from orchestrator.reservations.store import (
    BUCKET,
    PAYLOAD_HEADROOM,
    BookingStore,
    device_key,
)
from orchestrator.service import Orchestrator
from schemas import PipelineSpec
from schemas.bookings import BookingWindow, DeviceBookings
from schemas.codec import RemoteError, encode
from tests.harness import RecordingAgent, agent_config, stop_cluster
from transport.client import Client

pytestmark = pytest.mark.integration

LIMIT = 16 * 1024
FAST = device_key("fast", "cpu0")


def device(gflops: float) -> dict[str, Any]:
    return {"device_id": "cpu0", "kind": "cpu", "slots": 1, "gflops": gflops, "emulated": True}


def chain(n: int, **requires: Any) -> PipelineSpec:
    """`n` tasks one after another, 10x faster on the fast agent's device than the slow's."""
    run = {"kind": "synthetic", "seconds": 0.02, "ref_gflops": 100.0}
    return PipelineSpec.model_validate({
        "name": "chain",
        "tasks": [
            {"id": f"t{i}", "run": run, "deps": [f"t{i - 1}"] if i else [],
             "requires": requires}
            for i in range(n)
        ],
    })  # fmt: skip


def filler(n: int, expires_in: float = 7200.0) -> DeviceBookings:
    """`n` windows of a departed orchestrator an hour from now (they block nothing today),
    expiring `expires_in` seconds from now."""
    now = time.time()
    return DeviceBookings(device=FAST, windows=[
        BookingWindow(pipeline_id=f"old{i}", task_id="t", slot=0, start=now + 3600 + i,
                      end=now + 3600.5 + i, expires=now + expires_in, owner="gone")
        for i in range(n)
    ])  # fmt: skip


def windows_for(size: int) -> int:
    """The most filler windows whose key stays at or under `size` bytes."""
    n = 1
    while len(encode(filler(n + 1))) <= size:
        n += 1
    return n


class Cluster(NamedTuple):
    orch: Orchestrator
    client: Client
    nc: NATS
    agents: dict[str, RecordingAgent]


@pytest.fixture
async def cluster(nats_url: str) -> AsyncIterator[Cluster]:
    """An orchestrator with a 16 KiB limit, and agents "fast" and "slow"."""
    orch = Orchestrator(nats_url, booking_key_max_bytes=LIMIT)
    await orch.start()
    agents = [
        RecordingAgent(nats_url, agent_config("s1", "edge", probe_cpu=False, devices=[
            device(gflops)]), agent_id=aid, calibrate=False)
        for aid, gflops in (("fast", 1000.0), ("slow", 100.0))
    ]  # fmt: skip
    for a in agents:
        await a.start()
    assert await orch.wait_for_agents(2, timeout=10.0) == 2
    client = await Client.connect(nats_url)
    nc = await nats.connect(nats_url)
    try:
        yield Cluster(orch, client, nc, {a.agent_id: a for a in agents})
    finally:
        await nc.close()
        await client.close()
        await stop_cluster(orch, agents)


async def put_fast_key(orch: Orchestrator, nc: NATS, book: DeviceBookings) -> int:
    """Write the fast device's key behind the orchestrator's back; its revision, once the
    orchestrator's watch has it."""
    kv = await nc.jetstream().key_value(BUCKET)
    rev = int(await kv.put(FAST, encode(book)))
    await orch.store.wait_until(
        lambda: FAST in orch.store.cache and orch.store.cache[FAST].revision == rev, 10.0
    )
    return rev


async def test_free_devices_are_preferred_as_usual(
    cluster: Cluster,
) -> None:
    """The premise of the tests below: with its key small, the fast device gets the chain."""
    orch, client, nc, _agents = cluster
    await put_fast_key(orch, nc, filler(10))
    reply = await client.submit(chain(3))
    assert {p.agent_id for p in reply.plan} == {"fast"}


async def test_a_full_device_is_left_alone_and_its_key_not_written(
    cluster: Cluster,
) -> None:
    orch, client, nc, _agents = cluster
    n = windows_for(LIMIT + 2048)
    rev = await put_fast_key(orch, nc, filler(n))
    assert orch.store.full_devices(time.time()).keys() == {"fast:cpu0"}
    reply = await client.submit(chain(3))
    assert {p.agent_id for p in reply.plan} == {"slow"}
    assert orch.store.cache[FAST].revision == rev
    assert orch.store.stats.full == 0  # left out by planning, no booking was tried
    # what `mars agents` shows an operator
    by_id = {a.agent_id: a for a in (await client.agents()).agents}
    (fast,) = by_id["fast"].queues
    assert (fast.device_id, fast.windows, fast.full) == ("cpu0", n, True)
    assert LIMIT < fast.key_bytes == len(encode(filler(n))) <= LIMIT + 2048
    assert not any(q.full for q in by_id["slow"].queues)


async def test_a_full_device_takes_a_pipeline_that_evicts_to_fit(
    cluster: Cluster,
) -> None:
    """A full key holding a preemptible window where a higher-priority pipeline would run:
    that pipeline may evict it, its booking then need not grow the key, so planning must not
    leave the device out for it (only for pipelines that cannot evict there)."""
    orch, client, nc, _agents = cluster
    now = time.time()
    book = filler(windows_for(LIMIT + 2048))
    victim = BookingWindow(
        pipeline_id="v" * 128, task_id="w" * 128, slot=0, start=now - 1, end=now + 600,
        expires=now + 7200, owner="o" * 256, priority=100, preemptible=True, submitted=now,
    )  # fmt: skip
    book = book.model_copy(update={"windows": [victim, *book.windows]})
    await put_fast_key(orch, nc, book)
    assert orch.store.full_devices(time.time()).keys() == {"fast:cpu0"}
    # of the same priority: it cannot evict, the device is full for it
    same = await client.submit(chain(1))
    assert {p.agent_id for p in same.plan} == {"slow"}
    assert orch.store.stats.full == 0  # left out by planning, no booking was tried
    size = orch.store.sizes[FAST]
    # of a higher priority: it evicts the victim, and its own window takes less room
    high = chain(1).model_copy(update={"priority": 500})
    reply = await client.submit(high)
    assert {p.agent_id for p in reply.plan} == {"fast"}
    windows = orch.store.cache[FAST].book.windows
    assert victim.pipeline_id not in {w.pipeline_id for w in windows}
    assert reply.pipeline_id in {w.pipeline_id for w in windows}
    assert orch.store.stats.evictions == 1 and orch.store.sizes[FAST] < size


async def test_a_booking_that_would_pass_the_limit_is_refused_and_placed_elsewhere(
    cluster: Cluster,
) -> None:
    orch, client, nc, agents = cluster
    # just under the limit: planning still counts the device in; the chain's five windows
    # (~130 bytes each) would take the key past it
    rev = await put_fast_key(orch, nc, filler(windows_for(LIMIT - 200)))
    assert not orch.store.full_devices(time.time())
    reply = await client.submit(chain(5))
    assert {p.agent_id for p in reply.plan} == {"slow"}
    assert orch.store.stats.full == 1
    assert orch.store.cache[FAST].revision == rev  # nothing written to it
    status = await client.status(reply.pipeline_id)
    refused = [line for line in status.placement_log if "booking queue full" in line]
    assert refused and FAST in refused[0], status.placement_log
    # the first round's provisional offers to the fast agent were withdrawn: it ran nothing
    assert (await orch.wait_terminal(reply.pipeline_id, 20.0)).state == "succeeded"
    assert [e[1] for e in agents["slow"].log if e[0] == reply.pipeline_id] == [
        f"t{i}" for i in range(5)
    ]
    assert not [e for e in agents["fast"].log if e[0] == reply.pipeline_id]
    assert not [k for k in agents["fast"].core.jobs if k[0] == reply.pipeline_id]
    # ended: its windows are gone as planning sees them (and `mars agents` shows) at once,
    # though their release is written with the key's next write (within RELEASE_FLUSH_S)
    by_id = {a.agent_id: a for a in (await client.agents()).agents}
    assert [(q.device_id, q.windows) for q in by_id["slow"].queues] == [("cpu0", 0)]


async def test_a_key_full_of_expired_windows_takes_bookings_and_shrinks(
    cluster: Cluster,
) -> None:
    """Expired windows stay in a key until its next write drops them: a key over the limit
    only with them (a departed orchestrator's) must not keep its device out of planning, or
    nobody would ever write it again."""
    orch, client, nc, _agents = cluster
    await put_fast_key(orch, nc, filler(windows_for(LIMIT + 2048), expires_in=-1.0))
    assert FAST in orch.store.full and not orch.store.full_devices(time.time())
    (fast,) = next(a for a in (await client.agents()).agents if a.agent_id == "fast").queues
    assert fast.key_bytes > LIMIT and not fast.full
    reply = await client.submit(chain(3))
    assert {p.agent_id for p in reply.plan} == {"fast"}
    assert FAST not in orch.store.full
    assert len(orch.store.cache[FAST].book.windows) <= 3  # the chain's, or fewer once done
    assert orch.store.sizes[FAST] < 2048


async def test_nowhere_else_to_go_is_refused_with_the_reason(
    cluster: Cluster,
) -> None:
    orch, client, nc, _agents = cluster
    await put_fast_key(orch, nc, filler(windows_for(LIMIT + 2048)))
    with pytest.raises(RemoteError) as err:
        await client.submit(chain(2, pinned_agent="fast"))
    assert err.value.code == "unschedulable"
    assert "fast:cpu0: booking queue full" in str(err.value)
    details = err.value.envelope.details
    assert set(details) >= {"t0@fast:cpu0", "t1@fast:cpu0"}
    assert all(details[f"t{i}@fast:cpu0"].startswith("booking queue full") for i in (0, 1))
    # the pipeline was refused, not lost: the service still places elsewhere-able work
    ok = await client.submit(chain(2))
    assert {p.agent_id for p in ok.plan} == {"slow"}


async def test_the_limit_stays_under_the_servers_max_payload(nats_url: str) -> None:
    for wanted, expect in ((64 * 1024 * 1024, None), (LIMIT, LIMIT)):
        orch = Orchestrator(nats_url, booking_key_max_bytes=wanted)
        await orch.start()
        try:
            assert orch.nc is not None
            assert orch.store.key_max_bytes == (expect or orch.nc.max_payload - PAYLOAD_HEADROOM)
        finally:
            await orch.stop()


async def test_a_key_past_a_lowered_limit_is_still_renewed_and_released(nats_url: str) -> None:
    """Only growth is refused: a replica started with a lower limit than the key's size must
    still renew its own windows there (or lose them) and give them back."""
    nc = await nats.connect(nats_url)
    try:
        store = BookingStore(nc.jetstream(), key_max_bytes=LIMIT)
        await store.start()
        now = time.time()
        mine = filler(windows_for(LIMIT + 4096))
        mine = mine.model_copy(update={"windows": [
            w.model_copy(update={"owner": "me", "pipeline_id": "p1", "task_id": f"t{i}"})
            for i, w in enumerate(mine.windows)
        ]})  # fmt: skip
        kv = await nc.jetstream().key_value(BUCKET)
        rev = int(await kv.put(FAST, encode(mine)))
        await store.wait_until(lambda: FAST in store.cache, 10.0)
        assert FAST in store.full
        more = BookingWindow(pipeline_id="p2", task_id="t", slot=0, start=now, end=now + 1,
                             expires=now + 60, owner="me")  # fmt: skip
        refused = await store.book(FAST, [more], now)
        assert not refused.ok and refused.full.startswith("booking queue full")
        assert store.cache[FAST].revision == rev
        assert await store.renew(FAST, {"p1"}, now + 9000, now) > rev
        assert all(w.expires == now + 9000 for w in store.cache[FAST].book.windows)
        await store.release(FAST, "p1", now, ["t0", "t1"])
        assert len(store.cache[FAST].book.windows) == len(mine.windows) - 2
        await store.stop()
    finally:
        await nc.close()
