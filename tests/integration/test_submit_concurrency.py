"""Submissions are served side by side: one waiting on its agents does not hold up the next,
and the same id submitted twice at once is placed once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from orchestrator.client import Client
from schemas import OfferReply, PipelineSpec, TaskOffer
from tests.harness import agent_config, start_cluster, stop_cluster

pytestmark = pytest.mark.integration


def one_task(name: str) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {"name": name, "tasks": [{"id": "t", "run": {"kind": "synthetic", "seconds": 0.01}}]}
    )


async def test_a_submission_waiting_on_its_offers_does_not_hold_up_the_next(
    nats_url: str,
) -> None:
    orch, agents = await start_cluster(nats_url, {"c1": agent_config("s", "edge")})
    gate, holding = asyncio.Event(), asyncio.Event()
    held: list[str] = []
    real = orch.offer_many

    async def gated(offers: Sequence[TaskOffer]) -> list[OfferReply]:
        if offers and offers[0].pipeline_id.startswith("slow"):
            held.append(offers[0].pipeline_id)
            holding.set()
            await gate.wait()  # the agents of this pipeline answer only when the test says
        return await real(offers)

    orch.offer_many = gated  # type: ignore[method-assign]
    client = await Client.connect(nats_url, timeout=10.0)
    try:
        slow = asyncio.create_task(client.submit(one_task("s"), pipeline_id="slow"))
        again = asyncio.create_task(client.submit(one_task("s"), pipeline_id="slow"))
        await asyncio.wait_for(holding.wait(), 5.0)
        fast = await client.submit(one_task("f"), pipeline_id="fast")  # while slow is held
        assert fast.state == "running" and not slow.done() and not again.done()
        gate.set()
        first, second = await slow, await again
        assert first.state == "running" and second.pipeline_id == "slow"
        assert second.plan == first.plan and held == ["slow"]  # placed once, answered twice
        for pid in ("slow", "fast"):
            assert (await orch.wait_terminal(pid, 10.0)).state == "succeeded"
    finally:
        await client.close()
        await stop_cluster(orch, agents)
