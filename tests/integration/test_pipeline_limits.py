"""Pipelines at the limits a spec allows are placed and run, whatever their shape and however
many of their tasks land on one agent; a first placement that fails leaves nothing on any
agent, nor any booking (and, failing part-way, no record). Over a real nats-server, submitted
through the API as a client would."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest

from orchestrator.reservations.store import BookingStore
from orchestrator.service import Orchestrator
from schemas import PipelineSpec, subjects
from schemas.codec import RemoteError
from schemas.errors import ServiceError
from schemas.limits import MAX_DEPS, MAX_TASKS
from schemas.placement import MAX_BATCH, DrainCommand, DrainReply
from tests.harness import RecordingAgent, agent_config, start_cluster, stop_cluster
from transport.client import Client
from transport.rpc import request

pytestmark = pytest.mark.integration

#: One device each, so every task an agent is given is booked on one key: the default limit
#: of a key (~1,500 windows, `--booking-key-max-kib`) would refuse half a 5,000-task pipeline
#: there, and this is about what the offers carry, not about how deep a queue may be booked.
KEY_BYTES = 1 << 20


def tiny(tid: str, deps: list[str] | None = None) -> dict[str, Any]:
    return {"id": tid, "run": {"kind": "synthetic", "seconds": 0.0}, "deps": deps or []}


@contextlib.asynccontextmanager
async def two_agents(
    nats_url: str, **agent: Any
) -> AsyncIterator[tuple[Orchestrator, list[RecordingAgent], Client]]:
    """An orchestrator, agents a and b (one CPU each) and an API client."""
    # heartbeats far apart: planning 5,000 tasks holds the loop these in-process agents
    # beat on for a while, and a death verdict for a beat not sent is not what is tested here
    configs = {a: agent_config("s", "edge", heartbeat_interval_s=2.0, **agent) for a in "ab"}
    orch, agents = await start_cluster(nats_url, configs, booking_key_max_bytes=KEY_BYTES)
    client = await Client.connect(nats_url, timeout=60.0)
    try:
        yield orch, agents, client
    finally:
        await client.close()
        await stop_cluster(orch, agents)


def ran(agents: list[RecordingAgent], pid: str) -> dict[str, list[str]]:
    return {a.agent_id: [t for p, t, *_ in a.log if p == pid] for a in agents}


async def test_a_pipeline_of_the_most_tasks_a_spec_holds_is_placed_and_runs(
    nats_url: str,
) -> None:
    """5,000 tasks on two agents: more offers to each than one batch holds. Before, every
    such submit failed ("OfferBatch offers List should have at most 1000 items")."""
    spec = PipelineSpec.model_validate(
        {"name": "most", "tasks": [tiny(f"t{i}") for i in range(MAX_TASKS)]}
    )
    async with two_agents(nats_url) as (_orch, agents, client):
        reply = await client.submit(spec, "most-1")
        assert reply.state == "running"
        per_agent = {a: sum(p.agent_id == a for p in reply.plan) for a in "ab"}
        assert max(per_agent.values()) > MAX_BATCH, per_agent
        st = await client.wait("most-1", 60.0)
        assert st.state == "succeeded", st.reason
        done = ran(agents, "most-1")
        assert sorted(t for ts in done.values() for t in ts) == sorted(t.id for t in spec.tasks)
        assert {a: len(ts) for a, ts in done.items()} == per_agent  # where planned, once each
        assert all(not a.core.jobs for a in agents)


async def test_a_task_feeding_more_tasks_than_one_may_name_is_placed_and_runs(
    nats_url: str,
) -> None:
    """One task feeding 2,499: its offer names more consumers than a task may name inputs.
    Before, its offer could not be built ("TaskOffer consumers ... at most 1000")."""
    fed = [tiny(f"c{i}", ["src"]) for i in range(2_499)]
    assert len(fed) > MAX_DEPS
    spec = PipelineSpec.model_validate({"name": "fan", "tasks": [tiny("src"), *fed]})
    async with two_agents(nats_url) as (_orch, agents, client):
        reply = await client.submit(spec, "fan-1")
        assert reply.state == "running"
        assert {p.agent_id for p in reply.plan} == {"a", "b"}  # outputs cross agents too
        st = await client.wait("fan-1", 60.0)
        assert st.state == "succeeded", st.reason
        done = ran(agents, "fan-1")
        assert sorted(t for ts in done.values() for t in ts) == sorted(t.id for t in spec.tasks)


async def assert_nothing_held(nats_url: str, agents: list[RecordingAgent], pid: str) -> None:
    """No agent holds a job (running or queued, as `mars drain` would report it)."""
    for agent in agents:
        assert await agent.wait_idle(10.0), sorted(agent.core.jobs)[:5]
    nc = await nats.connect(nats_url)
    try:
        for agent in agents:
            rep = await request(
                nc, subjects.drain(agent.agent_id),
                DrainCommand(agent_id=agent.agent_id, resume=True), DrainReply,
            )  # fmt: skip
            assert (rep.running, rep.queued) == (0, 0)
    finally:
        await nc.close()


async def assert_no_bookings(nats_url: str, pid: str) -> None:
    """The bookings bucket itself holds no window of `pid` (read after its orchestrator
    stopped: a release it deferred is written before its store stops)."""
    nc = await nats.connect(nats_url)
    store = BookingStore(nc.jetstream())
    try:
        await store.start()
        assert store.cache, "nothing was ever booked"
        assert store.keys_holding(pid) == []
    finally:
        await store.stop()
        await nc.close()


async def test_a_first_placement_failing_part_way_leaves_nothing_anywhere(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agent a accepts its offers; those to b cannot be sent (an error in the orchestrator,
    injected; as an offer batch too large to build was): the submit is `unavailable`, and
    nothing of the pipeline is left: no job on either agent, no booking, no record, spec or
    lease. Before, a kept its jobs, queued for good (never committed, never asked about: its
    pipeline unknown), and cancelled them only when stopped."""
    spec = PipelineSpec.model_validate(
        {"name": "part", "tasks": [tiny(f"t{i}") for i in range(40)]}
    )
    async with two_agents(nats_url, cpu_slots=1) as (orch, agents, _client):
        real = orch.ask_agent
        accepted: list[bool] = []  # a's answers

        async def failing(subject_of: Any, agent_id: str, *a: Any, **kw: Any) -> Any:
            if subject_of is subjects.offers and agent_id == "b":
                raise RuntimeError("injected: b's offers cannot be sent")
            rep = await real(subject_of, agent_id, *a, **kw)
            if subject_of is subjects.offers:
                accepted.extend(r.accepted for r in rep.replies)
            return rep

        monkeypatch.setattr(orch, "ask_agent", failing)
        with pytest.raises(ServiceError) as err:
            await orch.submit_spec(spec, "part-1")
        assert err.value.code == "unavailable" and "failed part-way" in err.value.message
        assert accepted and all(accepted)  # a had taken its share
        await assert_nothing_held(nats_url, agents, "part-1")
        assert "part-1" not in orch.pipelines
        assert await orch.failover.runs.record("part-1") is None
        assert await orch.failover.runs.spec("part-1") is None
        assert await orch.failover.leases.read("part-1") is None
    await assert_no_bookings(nats_url, "part-1")


async def test_an_unplaceable_pipeline_withdraws_what_agents_accepted(nats_url: str) -> None:
    """Every agent refuses one task (a command not on its allowlist) and takes the rest: the
    pipeline is unschedulable, and the tasks accepted on the way are withdrawn from their
    agents and their windows given back. Before, they stayed queued there."""
    tasks = [tiny(f"t{i}") for i in range(20)]
    tasks.append({"id": "cmd", "run": {"kind": "exec", "argv": ["true"]}})
    spec = PipelineSpec.model_validate({"name": "unplaceable", "tasks": tasks})
    # exec tasks are taken, but no command is on the agents' allowlists
    kinds = ["synthetic", "exec"]
    async with two_agents(nats_url, cpu_slots=1, allowed_kinds=kinds) as (_orch, agents, client):
        with pytest.raises(RemoteError) as err:
            await client.submit(spec, "unplaceable-1")
        assert err.value.code == "unschedulable"
        assert any("not_allowlisted" in v for v in err.value.envelope.details.values()), err.value
        await assert_nothing_held(nats_url, agents, "unplaceable-1")
        st = await client.status("unplaceable-1")  # its end is what `status` answers
        assert st.state == "unschedulable"
    await assert_no_bookings(nats_url, "unplaceable-1")
