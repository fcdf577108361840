"""A round of placement re-sends an offer that changed since its agent accepted it (the task's
token after a provisional offer, where its consumers went); over a real nats-server, what
happens when the agent refuses that. Found by `python -m benchmarks.booking_stress` with a
fleet restart (seed 401): the same refused offer was sent again each round until the rounds
ran out, and a pipeline that could run elsewhere failed "no placement after 8 rounds"."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from edge_agent.core import AgentCore, Job
from edge_agent.executors import Output
from orchestrator.reservations.store import device_key
from orchestrator.service import Orchestrator
from schemas.placement import CancelCommand, OfferReply, TaskOffer
from sim.linkemu import LinkProxy
from tests.harness import EMULATED_CPU, RecordingAgent, agent_config, start_cluster, stop_cluster
from tests.integration.test_reservations import ONLY_ON_SLOW, fast_rejects, spec

pytestmark = pytest.mark.integration


def drains_on_update(core: AgentCore, task_id: str) -> asyncio.Event:
    """The agent begins draining (a real state: `mars drain`) just as the round's updated
    offer for `task_id` (its token after the provisional one) reaches it. Returns an event
    set once a withdrawal of that task reaches it."""
    admit, cancel = core.admit, core.cancel
    withdrawn = asyncio.Event()

    def admit_then_drain(offer: TaskOffer) -> OfferReply:
        if offer.task.id == task_id and offer.token > 0:
            core.draining = True
        return admit(offer)

    def noting_cancel(cmd: CancelCommand) -> list:  # type: ignore[type-arg]
        out = cancel(cmd)
        if any(j.offer.task.id == task_id for j in out):
            withdrawn.set()
        return out

    core.admit = admit_then_drain  # type: ignore[method-assign]
    core.cancel = noting_cancel  # type: ignore[method-assign]
    return withdrawn


async def test_a_task_whose_agent_refuses_its_updated_offer_is_placed_elsewhere(
    nats_url: str, tmp_path: Path
) -> None:
    """ "p" (fast on the GPU agent) feeds "m", which only the slow agent can run: round 0
    offers both to the fast agent, which takes p and rejects m; round 1 places m on the slow
    agent, and sends p's offer again with its token and m's new place. The fast agent has
    begun draining and refuses it: p (and m, which it feeds) are placed again on the slow
    agent, p's provisional job on the fast one is withdrawn, and the pipeline runs."""
    orch, agents = await start_cluster(nats_url, fast_rejects(tmp_path))
    fast, slow = agents
    withdrawn = drains_on_update(fast.core, "p")
    producer = {
        "id": "p",
        "run": {"kind": "synthetic", "seconds": 0.05},
        "profile": {"flops": 1e10},
    }
    try:
        reply = await orch.submit_spec(
            spec("upd", [producer, {**ONLY_ON_SLOW, "deps": ["p"]}]), "upd-1"
        )
        assert {p.task_id: p.agent_id for p in reply.plan} == {
            "p": "slow-has-model", "m": "slow-has-model"
        }  # fmt: skip
        run = orch.pipelines["upd-1"]
        log = "\n".join(run.placement_log)
        assert "fast-no-model rejected m" in log, log
        assert "fast-no-model refused p's updated offer (draining" in log, log
        # what the fast agent was given back: no window of the pipeline left on its key
        fast_key = device_key("fast-no-model", "gpu0")
        cached = orch.store.snapshot().get(fast_key)
        assert cached is None or not [w for w in cached.book.windows if w.pipeline_id == "upd-1"]
        async with asyncio.timeout(10):
            await withdrawn.wait()  # its provisional job of p let go
        assert ("upd-1", "p") not in fast.core.jobs
        done = await orch.wait_terminal("upd-1", 20.0)
        assert done.state == "succeeded", done.reason
        assert sorted(x[1] for x in slow.log if x[0] == "upd-1") == ["m", "p"]
        assert not [x for x in fast.log if x[0] == "upd-1"]  # nothing ran there
    finally:
        await stop_cluster(orch, agents)


class HeldProducer(RecordingAgent):
    """A real agent whose task "p" runs until the test lets it end."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.running = asyncio.Event()
        self.gate = asyncio.Event()

    async def _run(self, job: Job) -> Output:
        if job.offer.task.id == "p":
            self.running.set()
            await self.gate.wait()
        return await super()._run(job)


async def test_a_consumer_moved_while_its_producers_agent_cannot_hear_fetches_the_output(
    nats_url: str,
) -> None:
    """ "p" runs on "b", behind a link the test silences (TCP open, no byte crossing: a
    stalled network, before b is missed), its start not reported yet; its consumer "q" is
    placed again elsewhere meanwhile. b cannot be told where q went (no answer:
    `unhealthy`), and no re-plan would change that: q's new offer says p's output is ready,
    so q's agent asks b for it at commit and is sent it when p ends. Before, the
    re-placement sent b the same update each round and failed after 8 rounds."""
    host, port = nats_url.rsplit("//", 1)[1].split(":")
    link = LinkProxy(host, int(port))
    await link.start()
    orch = Orchestrator(nats_url)
    await orch.start()
    cpu = {"probe_cpu": False, "devices": [EMULATED_CPU]}
    # p's start is not reported (as for any task in its first `started_event_after_s`): its
    # owner holds it as accepted, and so tells its agent where q went; and b is missed only
    # after 3 x 3 s of silence, the link restored long before
    quiet = {**cpu, "heartbeat_interval_s": 3.0, "started_event_after_s": 60.0}
    b = HeldProducer(link.url, agent_config("s", "edge", **quiet), agent_id="b", calibrate=False)
    cloud = [
        RecordingAgent(nats_url, agent_config("s", "cloud", **cpu), agent_id=a, calibrate=False)
        for a in ("c", "d")
    ]
    agents = [b, *cloud]
    pipeline = spec("fetch", [
        {"id": "p", "run": {"kind": "synthetic", "seconds": 0.01},
         "requires": {"pinned_agent": "b"}},
        {"id": "q", "run": {"kind": "synthetic", "seconds": 0.01}, "deps": ["p"],
         "requires": {"tiers": ["cloud"]}},
    ])  # fmt: skip
    try:
        for a in agents:
            await a.start()
        assert await orch.wait_for_agents(3, timeout=10.0) == 3
        await orch.submit_spec(pipeline, "fetch-1")
        run = orch.pipelines["fetch-1"]
        async with asyncio.timeout(10):
            await b.running.wait()
        assert run.tasks["p"].state == "accepted"
        was = run.placements["q"].device_id
        old = {"q": run.placements["q"]}
        old_token = run.tasks["q"].token
        link.cut()
        await orch.placer.place(run, only={"q"}, exclude={("q", was)})
        now = run.placements["q"].device_id
        assert now != was and now.split(":")[0] in ("c", "d")
        log = "\n".join(run.placement_log)
        assert "p on b was not told where its consumers went (unhealthy" in log, log
        moved_to = next(a for a in cloud if a.agent_id == now.split(":")[0])
        job = moved_to.core.jobs[("fetch-1", "q")]
        assert [(i.task_id, i.ready) for i in job.offer.inputs] == [("p", True)]
        # the caller of a re-placement withdraws the old one and commits the new (recovery)
        await orch.cancel_tasks(run, old, "moved", max_token=old_token)
        link.restore()
        await orch.commits.commit_all(run, {"q"})
        b.gate.set()
        done = await orch.wait_terminal("fetch-1", 30.0)
        assert done.state == "succeeded", done.reason
        assert [x[1] for x in moved_to.log if x[0] == "fetch-1"] == ["q"]
        assert [x[1] for x in b.log if x[0] == "fetch-1"] == ["p"]  # p ran once
        assert run.recoveries == 0
    finally:
        b.gate.set()
        for a in agents:
            await a.stop()
        await orch.stop()
        await link.stop()
