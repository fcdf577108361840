"""Offers batched per agent: each offer admitted as if sent alone, replies in order; an agent
that only serves single offers (an older version) still gets every offer; commits are asked
again until answered."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS

from orchestrator.placement.commits import AGENT_ENCODING
from orchestrator.service import Orchestrator
from schemas import OfferBatch, OfferBatchReply, OfferReply, TaskOffer, TaskSpec, subjects
from schemas.codec import decode, encode, encoding_of
from schemas.limits import MAX_DEPS
from schemas.placement import MAX_BATCH, InputRef
from tests.harness import agent_config, start_cluster, stop_cluster
from transport.rpc import request, settle

pytestmark = pytest.mark.integration


def _offer(agent_id: str, incarnation: str, tid: str, **kw: Any) -> TaskOffer:
    return TaskOffer(
        pipeline_id="batch", agent_id=agent_id, incarnation=incarnation, device_id="cpu0",
        token=kw.pop("token", 1), task=TaskSpec.model_validate({"id": tid, "run": {
            "kind": "synthetic", "seconds": 0.01}}), **kw,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def orchestrator_and_client(nats_url: str) -> AsyncIterator[tuple[Orchestrator, NATS]]:
    """An orchestrator and a plain client that plays agents by hand."""
    orch = Orchestrator(nats_url)
    await orch.start()
    nc = await nats.connect(nats_url)
    try:
        yield orch, nc
    finally:
        await nc.close()
        await orch.stop()


async def test_batch_replies_per_offer_in_order(nats_url: str) -> None:
    orch, agents = await start_cluster(nats_url, {"b1": agent_config("s", "edge")})
    agent = agents[0]
    nc = await nats.connect(nats_url)
    try:
        inc = agent.incarnation
        batch = OfferBatch(
            offers=[
                _offer("b1", inc, "t0"),
                _offer("b1", "old-incarnation", "t1"),
                _offer("other", inc, "t2"),
                _offer("b1", inc, "t3", slot=99),
                _offer("b1", inc, "t4"),
            ]
        )
        rep = await request(nc, subjects.offers("b1"), batch, OfferBatchReply)
        assert [r.task_id for r in rep.replies] == ["t0", "t1", "t2", "t3", "t4"]
        assert [r.accepted for r in rep.replies] == [True, False, False, False, True]
        assert [r.code for r in rep.replies] == [None, "stale_incarnation", "bad_spec",
                                                  "bad_spec", None]  # fmt: skip
        assert set(agent.core.jobs) == {("batch", "t0"), ("batch", "t4")}
        # the same batch again: the same answers, nothing admitted twice
        again = await request(nc, subjects.offers("b1"), batch, OfferBatchReply)
        assert [r.accepted for r in again.replies] == [True, False, False, False, True]
        assert len(agent.core.jobs) == 2
    finally:
        await nc.close()
        await stop_cluster(orch, agents)


async def test_orchestrator_falls_back_to_single_offers(nats_url: str) -> None:
    """A responder serving only `cmd.offer` (as agents before batching did)."""
    seen: list[str] = []

    async def single(msg: Any) -> None:
        offer = decode(msg.data, TaskOffer, encoding_of(msg.headers))
        seen.append(offer.task.id)
        reply = OfferReply(
            pipeline_id=offer.pipeline_id, task_id=offer.task.id, agent_id=offer.agent_id,
            accepted=offer.task.id != "t1", code=None if offer.task.id != "t1" else "no_memory",
        )  # fmt: skip
        await msg.respond(encode(reply, encoding_of(msg.headers)))  # its headers go back

    async with orchestrator_and_client(nats_url) as (orch, nc):
        await nc.subscribe(subjects.offer("legacy"), cb=single)
        await settle(nc)
        offers = [_offer("legacy", "i", f"t{i}") for i in range(3)]
        replies = await orch.offer_many(offers)
        assert sorted(seen) == ["t0", "t1", "t2"]
        assert [(r.task_id, r.accepted) for r in replies] == [
            ("t0", True), ("t1", False), ("t2", True)
        ]  # fmt: skip
        # nobody at all behind an agent's subjects: every offer rejected, none lost
        gone = await orch.offer_many([_offer("nobody", "i", "a"), _offer("nobody", "i", "b")])
        assert [(r.task_id, r.accepted, r.code) for r in gone] == [
            ("a", False, "unhealthy"), ("b", False, "unhealthy")
        ]  # fmt: skip


async def test_commit_is_asked_again_until_the_agent_answers(nats_url: str) -> None:
    """The first commit gets no answer (lost, or the agent was busy): the orchestrator asks
    again, and stops once the agent answers."""
    from orchestrator.state.pipelines import PipelineRun
    from schemas import CommitCommand, PipelineSpec

    got: list[CommitCommand] = []

    async def flaky(msg: Any) -> None:
        cmd = decode(msg.data, CommitCommand, encoding_of(msg.headers))
        got.append(cmd)
        if len(got) > 1:  # the first one goes unanswered
            await msg.respond(encode(cmd, encoding_of(msg.headers)))

    async with orchestrator_and_client(nats_url) as (orch, nc):
        await nc.subscribe(subjects.commit("slow"), cb=flaky)
        await settle(nc)
        spec = PipelineSpec.model_validate(
            {"name": "c", "tasks": [{"id": "a", "run": {"kind": "synthetic", "seconds": 0.01}}]}
        )
        run = PipelineRun("commit-again", spec, 0.0)
        run.tasks["a"].agent_id, run.tasks["a"].state = "slow", "accepted"
        await orch.commits.commit_all(run, {"a"})
        assert [c.task_ids for c in got] == [["a"], ["a"]]


async def test_offers_past_one_batch_reach_the_agent_in_several(nats_url: str) -> None:
    """More offers to one agent than a batch holds, and offers together larger than the
    server takes in one message: sent in several batches, each offer answered, the
    orchestrator's connection kept. Before, the first failed to build (`MAX_BATCH`) and the
    second to send (`MaxPayloadError`), and the placement with them."""
    orch, agents = await start_cluster(nats_url, {"b1": agent_config("s", "edge")})
    try:
        assert orch.nc is not None
        inc = agents[0].incarnation
        many = [_offer("b1", inc, f"m{i}") for i in range(MAX_BATCH * 2 + 500)]
        replies = await orch.offer_many(many)
        assert [r.task_id for r in replies] == [x.task.id for x in many]
        assert all(r.accepted for r in replies), {r.code for r in replies}
        # each offer names as many inputs as a task may have: together more than a message holds
        inputs = [InputRef(task_id=f"p{j}", agent_id="b1") for j in range(MAX_DEPS)]
        big = [_offer("b1", inc, f"big{i}", inputs=inputs) for i in range(64)]
        size = len(encode(OfferBatch(offers=big), AGENT_ENCODING))
        assert size > orch.nc.max_payload
        replies = await orch.offer_many(big)
        assert all(r.accepted for r in replies), {r.code for r in replies}
        assert len(agents[0].core.jobs) == len(many) + len(big)
        assert orch.nc.is_connected and orch.nc.stats["reconnects"] == 0
    finally:
        await stop_cluster(orch, agents)
