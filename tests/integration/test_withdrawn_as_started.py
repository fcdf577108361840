"""A job withdrawn in the same turn of the event loop as its start: its run is cancelled
before its first step, so it never enters the code that lets the job and its slot go. The
agent must let them go anyway (before, the device's slot stayed taken and it ran nothing
more: found as 25-45 s stalls in `booking_stress --task-ms 20,120`). A real agent over a
real nats-server, driven through its own core and handlers."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from schemas.pipeline import TaskSpec
from schemas.placement import CancelCommand, CommitCommand, TaskOffer
from tests.harness import one_device_agent

pytestmark = pytest.mark.integration


def offer(agent_id: str, incarnation: str, tid: str, token: int) -> TaskOffer:
    return TaskOffer(
        pipeline_id="p", agent_id=agent_id, incarnation=incarnation, device_id="cpu0",
        token=token, task=TaskSpec.model_validate(
            {"id": tid, "run": {"kind": "synthetic", "seconds": 0.01}}
        ),
    )  # fmt: skip


async def test_a_job_withdrawn_as_it_starts_frees_its_slot(nats_url: str) -> None:
    agent = await one_device_agent(nats_url)
    try:
        core = agent.core
        assert core.devices["cpu0"].slots == 1
        for tid in ("a", "b"):
            assert core.admit(offer(agent.agent_id, agent.incarnation, tid, 5)).accepted
        core.commit(CommitCommand(pipeline_id="p", task_ids=["a"], tokens=[5]))
        agent._start_ready()  # a starts: its run is spawned, not yet begun
        run = agent._running[("p", "a")]
        agent._withdraw(CancelCommand(pipeline_id="p", task_ids=["a"], max_token=5))
        with contextlib.suppress(asyncio.CancelledError):
            await run  # cancelled before its first step; its done callbacks have run now
        assert ("p", "a") not in core.jobs and core.running["cpu0"] == 0
        assert ("p", "a") not in agent._running
        # the slot is free: b, committed now, runs (through the agent's own handlers)
        core.commit(CommitCommand(pipeline_id="p", task_ids=["b"], tokens=[5]))
        agent._start_ready()
        await agent._running[("p", "b")]
        assert [x[1] for x in agent.log] == ["b"]
        # a did not run: offered here again, naming the placement it replaces, it is taken
        again = offer(agent.agent_id, agent.incarnation, "a", 6).model_copy(update={"replaces": 5})
        assert core.admit(again).accepted
    finally:
        await agent.stop()
