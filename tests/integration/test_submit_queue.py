"""Submissions waiting to be served (over a real nats-server): one whose client has given up
is answered `unavailable` and never placed; one beyond the queue's bound is refused at once
with that reason, not left to time out."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import NamedTuple

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js.errors import KeyNotFoundError

from orchestrator.api.submissions import SUBMITS_AT_ONCE
from orchestrator.service import Orchestrator
from schemas import OfferReply, PipelineSpec, SubmitReply, SubmitRequest, TaskOffer, subjects
from schemas.codec import RemoteError, decode_reply, encode, headers_for
from schemas.failover import OWNERS_BUCKET
from tests.harness import RecordingAgent, agent_config
from transport.client import Client
from transport.rpc import request

pytestmark = pytest.mark.integration


def one_task(name: str) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {"name": name, "tasks": [{"id": "t", "run": {"kind": "synthetic", "seconds": 0.01}}]}
    )


class Held(NamedTuple):
    orch: Orchestrator
    nc: NATS
    gate: asyncio.Event
    busy: list[asyncio.Task[SubmitReply]]


async def hold_every_worker(nats_url: str, orch: Orchestrator) -> AsyncIterator[Held]:
    """`orch` started with one agent, and SUBMITS_AT_ONCE submissions ("held-N") stuck in
    their offers until `gate` is set: whatever is submitted next waits in the queue."""
    await orch.start()
    agent = RecordingAgent(nats_url, agent_config("s", "edge"), agent_id="a1", calibrate=False)
    await agent.start()
    client = await Client.connect(nats_url, timeout=30.0)
    nc = await nats.connect(nats_url)
    gate, all_held = asyncio.Event(), asyncio.Event()
    held: list[str] = []
    real = orch.start_offers

    def gated(offers: Sequence[TaskOffer]) -> asyncio.Future[list[OfferReply]]:
        if not offers or not offers[0].pipeline_id.startswith("held"):
            return real(offers)
        held.append(offers[0].pipeline_id)
        if len(held) == SUBMITS_AT_ONCE:
            all_held.set()

        async def later() -> list[OfferReply]:
            await gate.wait()
            return await real(offers)

        return asyncio.ensure_future(later())

    orch.start_offers = gated  # type: ignore[method-assign]
    try:
        assert await orch.wait_for_agents(1, timeout=10.0) == 1
        busy = [
            asyncio.ensure_future(client.submit(one_task(f"held-{i}"), f"held-{i}"))
            for i in range(SUBMITS_AT_ONCE)
        ]
        await asyncio.wait_for(all_held.wait(), 10.0)
        yield Held(orch, nc, gate, busy)
        gate.set()
        for reply in await asyncio.gather(*busy):
            assert reply.state == "running"
    finally:
        gate.set()
        await nc.close()
        await client.close()
        await agent.stop()
        await orch.stop()


@pytest.fixture
async def held(nats_url: str) -> AsyncIterator[Held]:
    async for h in hold_every_worker(nats_url, Orchestrator(nats_url)):
        yield h


@pytest.fixture
async def held_short_queue(nats_url: str) -> AsyncIterator[Held]:
    async for h in hold_every_worker(nats_url, Orchestrator(nats_url, max_queued_submits=1)):
        yield h


async def test_a_submission_its_client_gave_up_on_is_not_placed(held: Held, nats_url: str) -> None:
    orch = held.orch
    impatient = await Client.connect(nats_url, timeout=0.2)
    try:
        with pytest.raises(asyncio.TimeoutError):  # queued behind the held ones
            await impatient.submit(one_task("late"), "late")
    finally:
        await impatient.close()
    held.gate.set()  # the workers go on, and come to it
    await orch.wait_for(lambda: orch.submissions.stale == 1, timeout=10.0)
    assert "late" not in orch.pipelines
    owners = await held.nc.jetstream().key_value(OWNERS_BUCKET)
    with pytest.raises(KeyNotFoundError):  # never claimed: the id is free
        await owners.get("late")
    again = await request(
        held.nc, subjects.SUBMIT, SubmitRequest(pipeline=one_task("late"), pipeline_id="late",
                                                timeout_ms=10_000), SubmitReply, timeout=10.0,
    )  # fmt: skip
    assert again.pipeline_id == "late" and again.state == "running"


async def test_a_submission_beyond_the_queue_is_refused_at_once(held_short_queue: Held) -> None:
    orch, nc = held_short_queue.orch, held_short_queue.nc
    # one connection: the queued one reaches the orchestrator before the one refused
    inbox = nc.new_inbox()
    replies = await nc.subscribe(inbox)
    queued = SubmitRequest(pipeline=one_task("queued"), pipeline_id="queued", timeout_ms=30_000)
    await nc.publish(subjects.SUBMIT, encode(queued), reply=inbox, headers=headers_for("msgpack"))
    extra = SubmitRequest(pipeline=one_task("extra"), pipeline_id="extra", timeout_ms=30_000)
    with pytest.raises(RemoteError) as refused:
        await request(nc, subjects.SUBMIT, extra, SubmitReply, timeout=5.0)
    assert refused.value.code == "unavailable"
    assert "1 submissions are waiting" in str(refused.value)
    assert orch.submissions.refused == 1 and "extra" not in orch.pipelines
    held_short_queue.gate.set()
    msg = await replies.next_msg(timeout=10.0)
    assert decode_reply(msg.data, msg.headers, SubmitReply).pipeline_id == "queued"


async def test_a_timeout_out_of_bounds_is_refused_with_the_field_named(
    held: Held,
) -> None:
    """Bad input gets a clear error even while every worker is busy: it is decoded when
    served, and the queue does not hide it."""
    held.gate.set()
    body = {"pipeline": one_task("bad").model_dump(mode="json"), "timeout_ms": 0}
    msg = await held.nc.request(
        subjects.SUBMIT, json.dumps(body).encode(), timeout=10.0,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with pytest.raises(RemoteError) as bad:
        decode_reply(msg.data, msg.headers, SubmitReply)
    assert bad.value.code == "invalid"
    assert "timeout_ms" in bad.value.envelope.details
    assert "bad" not in held.orch.pipelines
