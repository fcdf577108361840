"""Jobs nobody will start are dropped by the agent holding them (edge_agent/service.py
`check_stale`): a withdrawal the orchestrator sent while the agent was cut off is lost, and
such a job would otherwise wait, and ask for its inputs, for ever."""

from __future__ import annotations

import time
from typing import Any

import pytest

from edge_agent.service import Agent
from schemas import PipelineSpec
from schemas.placement import CommitCommand, InputRef, TaskOffer
from tests.harness import agent_config, start_cluster, stop_cluster

pytestmark = pytest.mark.integration


def configs() -> dict[str, Any]:
    cpu = {"device_id": "cpu0", "kind": "cpu", "gflops": 50.0, "emulated": True}
    return {a: agent_config("s1", "edge", probe_cpu=False, devices=[cpu]) for a in ("a", "b")}


def spec(lead_s: float) -> PipelineSpec:
    """`lead` on agent a makes the input of `tail`, on agent b."""
    return PipelineSpec.model_validate({"name": "stale", "tasks": [
        {"id": "lead", "requires": {"pinned_agent": "a"},
         "run": {"kind": "synthetic", "seconds": lead_s, "output_bytes": 100}},
        {"id": "tail", "requires": {"pinned_agent": "b"}, "deps": ["lead"],
         "run": {"kind": "synthetic", "seconds": 0.001}},
    ]})  # fmt: skip


def plant(agent: Agent, like: TaskOffer, token: int) -> None:
    """A committed job on `agent` for `like`'s task whose input nobody will send: what a lost
    withdrawal leaves behind."""
    offer = like.model_copy(update={
        "agent_id": agent.agent_id, "incarnation": agent.incarnation, "token": token,
        "inputs": [InputRef(task_id="lead", agent_id="nobody", nbytes=100)],
    })  # fmt: skip
    assert agent.core.admit(offer).accepted
    agent.core.commit(CommitCommand(pipeline_id=offer.pipeline_id, task_ids=[offer.task.id]))
    assert agent.core.jobs[(offer.pipeline_id, offer.task.id)].committed


async def test_a_job_placed_elsewhere_or_of_an_ended_pipeline_is_dropped(nats_url: str) -> None:
    orch, agents = await start_cluster(nats_url, configs())
    a, b = sorted(agents, key=lambda x: x.agent_id)
    try:
        await orch.submit_spec(spec(lead_s=1.0), "p")
        tail = b.core.jobs[("p", "tail")]  # committed on b, waiting for lead's output
        later = time.monotonic() + a.stale_check_s + 1.0
        # the real placement is kept, by the agent holding it, while the pipeline runs
        assert await b.check_stale(now=later) == 0
        assert ("p", "tail") in b.core.jobs
        # a copy on a (a move whose withdrawal a never got): the API says tail is on b
        plant(a, tail.offer, token=tail.offer.token)
        assert await a.check_stale(now=later) == 1
        assert ("p", "tail") not in a.core.jobs and ("p", "tail") in b.core.jobs
        # asked about once per period, not at every sweep
        plant(a, tail.offer, token=tail.offer.token + 1)
        a.core.jobs[("p", "tail")].checked = later
        assert await a.check_stale(now=later) == 0
        run = await orch.wait_terminal("p", 10.0)
        assert run.state == "succeeded", run.reason
        # once the pipeline ended, any job of it left anywhere goes
        assert await a.check_stale(now=later + a.stale_check_s + 1.0) == 1
        assert not a.core.jobs
    finally:
        await stop_cluster(orch, agents)


async def test_a_pipeline_nobody_answers_for_keeps_its_jobs(nats_url: str) -> None:
    orch, agents = await start_cluster(nats_url, configs())
    a, b = sorted(agents, key=lambda x: x.agent_id)
    try:
        await orch.submit_spec(spec(lead_s=0.05), "p")
        like = b.core.jobs[("p", "tail")].offer
        other = like.model_copy(update={"pipeline_id": "unknown"})
        plant(a, other, token=7)
        assert await a.check_stale(now=time.monotonic() + a.stale_check_s + 1.0) == 0
        assert ("unknown", "tail") in a.core.jobs  # not_found: nothing says it is over
    finally:
        await stop_cluster(orch, agents)
