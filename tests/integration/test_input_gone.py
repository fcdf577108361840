"""A consumer moved while its producer ended: the output went to the consumer's old place
and the producer let it go. Its new agent finds the input gone when it asks for it and says
so, and the orchestrator re-runs the producer at once instead of when the stall watchdog
finds the consumer starved (two looks of `stall_s`). Over a real nats-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple

import nats
import pytest
from nats.aio.msg import Msg

from edge_agent.core import Job
from edge_agent.executors import Output
from orchestrator import recovery
from orchestrator.pipelines import PipelineRun
from orchestrator.placement import Placer
from orchestrator.reservations.store import device_key
from orchestrator.service import Orchestrator
from schemas import PipelineSpec, subjects
from schemas.codec import encode
from schemas.placement import DataAck, DataTransfer, EvictNotice, InputGone
from tests.harness import RecordingAgent, agent_config, stop_cluster

pytestmark = pytest.mark.integration

#: Longer than any test here waits: only the new path can end these pipelines in time.
STALL_S = 60.0


class GatedAgent(RecordingAgent):
    """Holds each task named in `gates` until its gate is set (and says nothing of it
    meanwhile: its started event would only go out after a minute)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.gates: dict[str, asyncio.Event] = {}

    async def _run(self, job: Job) -> Output:
        gate = self.gates.get(job.offer.task.id)
        if gate is not None:
            await gate.wait()
        return await super()._run(job)


def agent(url: str, name: str, gflops: float) -> GatedAgent:
    dev = {"device_id": "cpu0", "kind": "cpu", "slots": 1, "gflops": gflops, "emulated": True}
    cfg = agent_config("s1", "edge", probe_cpu=False, devices=[dev], started_event_after_s=60.0)
    return GatedAgent(url, cfg, agent_id=name, calibrate=False)


def t_then_u() -> PipelineSpec:
    """t on agent a, then u, 10x faster on b than on a."""
    run = {"kind": "synthetic", "seconds": 0.02, "ref_gflops": 100.0, "output_bytes": 64}
    return PipelineSpec.model_validate({"name": "p", "tasks": [
        {"id": "t", "run": run, "requires": {"pinned_agent": "a"}},
        {"id": "u", "run": run, "deps": ["t"]},
    ]})  # fmt: skip


class Cluster(NamedTuple):
    orch: Orchestrator
    agents: dict[str, GatedAgent]


@pytest.fixture
async def cluster(nats_url: str) -> AsyncIterator[Cluster]:
    """Agents a (slow; t waits there until `gates["t"]` is set), b (fast) and c (in between);
    an orchestrator whose watchdog waits `STALL_S`."""
    orch = Orchestrator(nats_url, stall_s=STALL_S)
    await orch.start()
    agents = {n: agent(nats_url, n, g) for n, g in (("a", 100.0), ("b", 1000.0), ("c", 500.0))}
    agents["a"].gates["t"] = asyncio.Event()  # t waits for the test
    for a in agents.values():
        await a.start()
    try:
        assert await orch.wait_for_agents(3, timeout=10.0) == 3
        yield Cluster(orch, agents)
    finally:
        await stop_cluster(orch, list(agents.values()))


async def move_as_t_ends(
    cluster: Cluster,
    nats_url: str,
    away: list[str],
    then: Callable[[PipelineRun], Awaitable[None]],
) -> PipelineRun:
    """u is evicted from b while t is still to run, so it may move; while it is re-placed, t
    ends and hands its output to u on b, which takes it (and t's agent lets it go); b (and
    the agents named in `away`) then drain, and the re-placement goes on. `then` runs next;
    returns the pipeline at its end."""
    orch, agents = cluster
    a, b = agents["a"], agents["b"]
    got = asyncio.Event()  # u's input reached b
    deliver = b.core.deliver

    def noted(msg: DataTransfer, data: bytes | None = None) -> DataAck:
        ack = deliver(msg, data)
        if msg.consumer == "u" and ack.ok:
            got.set()
        return ack

    b.core.deliver = noted  # type: ignore[method-assign]
    b.gates["u"] = asyncio.Event()  # b's slot stays busy: u, given its input, does not start
    reached, go = asyncio.Event(), asyncio.Event()
    place = Placer.place

    async def held(self: Placer, run: Any, only: set[str] | None = None, **kw: Any) -> None:
        if only == {"u"} and not go.is_set():  # the eviction's re-placement: let t end first
            reached.set()
            await go.wait()
        await place(self, run, only, **kw)

    orch.placer.place = held.__get__(orch.placer)  # type: ignore[method-assign]
    await orch.submit_spec(t_then_u(), "p")
    run = orch.pipelines["p"]
    assert (run.tasks["t"].agent_id, run.tasks["u"].agent_id) == ("a", "b")
    nc = await nats.connect(nats_url)
    try:
        note = EvictNotice(pipeline_id="p", task_ids=["u"], device=device_key("b", "cpu0"),
                           by_pipeline="hi", reason="preempted by higher-priority hi")  # fmt: skip
        await nc.publish(subjects.eviction("p"), encode(note))
        await asyncio.wait_for(reached.wait(), 10.0)  # u found movable: t had not run
        a.gates["t"].set()
        await asyncio.wait_for(got.wait(), 10.0)
        await orch.wait_for(lambda: run.tasks["t"].state == "succeeded", 10.0)
        for name in ("b", *away):  # they take nothing new: u moves
            agents[name].drain()
        go.set()
        await then(run)
        done = await orch.wait_terminal("p", 10.0)
    finally:
        await nc.close()
    assert done.state == "succeeded", done.reason
    return done


async def nothing(_run: PipelineRun) -> None:
    return None


@pytest.mark.parametrize("to", ["c", "a"])
async def test_a_consumer_moved_as_its_producer_ended_gets_the_producer_run_again(
    cluster: Cluster, nats_url: str, to: str
) -> None:
    """u moves to c (or to a, t's own agent), where nobody will send t's output again: its
    agent finds it gone when it asks a (or looks itself), and t is run again, well before the
    stall watchdog would have noticed."""
    orch, agents = cluster
    done = await move_as_t_ends(cluster, nats_url, ["c"] if to == "a" else [], nothing)
    log = "\n".join(done.placement_log)
    ran = {n: [x[1] for x in ag.log] for n, ag in agents.items()}
    assert ran["a"][:2] == ["t", "t"], log  # made again
    assert ran[to][-1] == "u" and ran["b"] == [] and sum(r.count("u") for r in ran.values()) == 1
    assert agents[to].data.stats["inputs_gone"] >= 1
    assert orch.inputs_regrown == 1
    assert f"{to}: input t of u is gone from a" in log and "re-running t" in log, log


async def test_a_starved_re_placement_that_finds_no_room_is_tried_again(
    cluster: Cluster, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, with a (where t must run) draining too: t cannot run again, so the
    re-placement fails and waits; once a takes work again it is tried again (every
    STUCK_RETRY_S), as starved tasks, not as a dead agent's cancelled ones (of which there
    are none, so that retry re-placed nothing and the pipeline waited for the watchdog)."""
    monkeypatch.setattr(recovery, "STUCK_RETRY_S", 0.2)
    orch, agents = cluster

    async def refused_then_room(run: PipelineRun) -> None:
        await orch.wait_for(lambda: any("cannot re-place" in x for x in run.placement_log), 10)
        agents["a"].resume()

    done = await move_as_t_ends(cluster, nats_url, ["a"], refused_then_room)
    log = "\n".join(done.placement_log)
    assert [x[1] for x in agents["a"].log] == ["t", "t"], log
    assert [x[1] for x in agents["c"].log] == ["u"], log
    assert "re-running t" in log, log


async def test_reports_that_do_not_hold_are_left_alone(cluster: Cluster) -> None:
    """A report about another placement of the consumer, a producer not finished or run
    elsewhere, a task that is no consumer of it, another pipeline, or bytes that are no
    report at all: nothing is re-run, and the service goes on. (The handler is called as the
    subscription calls it, so each report is handled when the call returns.)"""
    orch, agents = cluster
    await orch.submit_spec(t_then_u(), "p")
    run = orch.pipelines["p"]
    u = run.tasks["u"]
    assert orch.nc is not None and u.agent_id == "b"
    true = InputGone(pipeline_id="p", consumer="u", token=u.token, agent_id="b",
                     producer="t", producer_agent="a")  # fmt: skip
    wrong = [
        true.model_copy(update={"token": u.token + 1}),
        true.model_copy(update={"agent_id": "c"}),
        true.model_copy(update={"producer_agent": "b"}),  # t runs on a
        true.model_copy(update={"consumer": "t", "producer": "u"}),  # t is fed by nobody
        true.model_copy(update={"pipeline_id": "nope"}),
        true,  # t has not run yet (held): its output is still to come
    ]
    for data in [*(encode(w) for w in wrong), b"\xff not a report", b"{}"]:
        await orch._on_input_gone(Msg(orch.nc, subjects.input_gone("p"), data=data))
    assert orch.inputs_regrown == 0 and not any("is gone" in x for x in run.placement_log)
    agents["a"].gates["t"].set()
    done = await orch.wait_terminal("p", 10.0)
    assert done.state == "succeeded" and done.recoveries == 0
    assert [x[1] for x in agents["a"].log] == ["t"]  # run once
    # the same report once u has run: nothing waits for the input any more
    await orch._on_input_gone(Msg(orch.nc, subjects.input_gone("p"), data=encode(true)))
    assert orch.inputs_regrown == 0
