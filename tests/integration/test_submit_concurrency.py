"""Two submissions are served at once: one waiting on its agents' answers does not hold up
the next, and the same id submitted twice at once is placed once (over a real nats-server)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from orchestrator.api.submissions import SUBMITS_AT_ONCE
from schemas import OfferReply, PipelineSpec, TaskOffer
from tests.harness import agent_config, start_cluster, stop_cluster
from transport.client import Client

pytestmark = pytest.mark.integration


def one_task(name: str) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {"name": name, "tasks": [{"id": "t", "run": {"kind": "synthetic", "seconds": 0.01}}]}
    )


async def test_a_submission_waiting_on_its_agents_does_not_hold_up_the_next(
    nats_url: str,
) -> None:
    assert SUBMITS_AT_ONCE >= 2
    orch, agents = await start_cluster(nats_url, {"c1": agent_config("s", "edge")})
    gate, holding = asyncio.Event(), asyncio.Event()
    held: list[str] = []
    real = orch.start_offers

    def gated(offers: Sequence[TaskOffer]) -> asyncio.Future[list[OfferReply]]:
        if not offers or offers[0].pipeline_id != "slow":
            return real(offers)
        held.append(offers[0].pipeline_id)
        holding.set()

        async def later() -> list[OfferReply]:
            await gate.wait()  # this pipeline's agents answer only when the test says
            return await real(offers)

        return asyncio.ensure_future(later())

    orch.start_offers = gated  # type: ignore[method-assign]
    waiting = asyncio.Event()

    class Submitting(dict[str, asyncio.Event]):
        """The orchestrator's ids under way, telling the test when a second submission of
        one finds the first still under way."""

        def get(  # type: ignore[override]
            self, key: str, default: asyncio.Event | None = None
        ) -> asyncio.Event | None:
            got = super().get(key, default)
            if got is not None:
                waiting.set()
            return got

    orch.submissions.submitting = Submitting()
    client = await Client.connect(nats_url, timeout=10.0)
    try:
        assert orch.idle()
        slow = asyncio.create_task(client.submit(one_task("s"), pipeline_id="slow"))
        await asyncio.wait_for(holding.wait(), 5.0)
        assert not orch.idle()  # a paced collection would wait (eventloop.PacedGc)
        # the next submission is served while the first waits on its agents
        fast = await asyncio.wait_for(client.submit(one_task("f"), pipeline_id="fast"), 5.0)
        assert fast.state == "running" and not slow.done()
        # the same id again, while the first is under way: it waits for it
        again = asyncio.create_task(client.submit(one_task("s"), pipeline_id="slow"))
        await asyncio.wait_for(waiting.wait(), 5.0)
        assert not slow.done() and not again.done()
        gate.set()
        first, second = await slow, await again
        assert first.state == "running" and second.pipeline_id == "slow"
        assert second.plan == first.plan and held == ["slow"]  # placed once, answered twice
        for pid in ("slow", "fast"):
            assert (await orch.wait_terminal(pid, 10.0)).state == "succeeded"
        assert orch.idle()
    finally:
        gate.set()
        await client.close()
        await stop_cluster(orch, agents)
