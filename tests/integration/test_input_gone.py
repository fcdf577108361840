"""A consumer moved while its producer ended: the output went to the consumer's old place.
Its producer's agent keeps a delivered output a while, so the consumer's new agent fetches it
and the producer runs once. Where the output is gone all the same (let go: kept no longer, or
lost with a restart), the new agent finds the input gone when it asks for it and says so, and
the orchestrator re-runs the producer at once instead of when the stall watchdog finds the
consumer starved (two looks of `stall_s`). Over a real nats-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NamedTuple

import nats
import pytest
from nats.aio.msg import Msg

from edge_agent import dataplane, retention
from edge_agent.core import Job
from edge_agent.executors import Output
from orchestrator.placement.placer import Placer
from orchestrator.reliability import recovery
from orchestrator.reservations.store import device_key
from orchestrator.service import Orchestrator
from orchestrator.state.pipelines import PipelineRun
from schemas import PipelineSpec, subjects
from schemas.api import CancelRequest
from schemas.codec import encode
from schemas.events import TaskEvent
from schemas.placement import EvictNotice, InputGone, OfferReply, TaskOffer
from tests.harness import RecordingAgent, agent_config, stop_cluster
from tests.integration.test_failover import hold_renewals

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
    *,
    heard: bool = True,
) -> PipelineRun:
    """u is evicted from b while t is still to run, so it may move; while it is re-placed, t
    ends and hands its output to u on b, which takes it (and t's agent lets it go); b (and
    the agents named in `away`) then drain, and the re-placement goes on, once t's end has
    reached the orchestrator (with `heard`) or at once. `then` runs next; returns the
    pipeline at its end."""
    orch, agents = cluster
    a, b = agents["a"], agents["b"]
    released = asyncio.Event()  # b acknowledged t's output: a waits on it no more
    ack = a.data.store.ack

    def noted(pipeline_id: str, producer: str, consumer: str, token: int | None = None) -> Any:
        out = ack(pipeline_id, producer, consumer, token)
        if ("p", "t") not in a.data.store.entries and a.log:
            released.set()
        return out

    a.data.store.ack = noted  # type: ignore[method-assign]
    # b's one slot is taken (as by another pipeline's task): u, given its input, waits in b's
    # queue, not started (a started u would keep its place: `already_running`)
    b.core.running["cpu0"] += 1
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
        # u's window taken (as a higher-priority booking would), then the notice
        key = device_key("b", "cpu0")
        await orch.store.release(key, "p", orch.wall(), ["u"])
        note = EvictNotice(pipeline_id="p", task_ids=["u"], device=key,
                           by_pipeline="hi", reason="preempted by higher-priority hi")  # fmt: skip
        await nc.publish(subjects.eviction("p"), encode(note))
        await asyncio.wait_for(reached.wait(), 10.0)  # u found movable: t had not run
        a.gates["t"].set()
        await asyncio.wait_for(released.wait(), 10.0)
        if heard:
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


@pytest.fixture
def let_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """Agents keep no output every consumer acknowledged: t's is gone once b has it."""
    monkeypatch.setattr(retention, "DELIVERED_KEPT", 0)


@pytest.mark.parametrize("to", ["c", "a"])
async def test_a_consumer_moved_as_its_producer_ended_fetches_the_output_delivered_before(
    cluster: Cluster, nats_url: str, to: str
) -> None:
    """u takes t's output on b, then moves to c (or a): t's agent still keeps the output it
    delivered to b, so u's new agent gets it, and t runs once."""
    orch, agents = cluster
    done = await move_as_t_ends(cluster, nats_url, ["c"] if to == "a" else [], nothing)
    log = "\n".join(done.placement_log)
    ran = {n: [x[1] for x in ag.log] for n, ag in agents.items()}
    assert ran["a"].count("t") == 1, log
    assert ran[to][-1] == "u" and ran["b"] == [] and sum(r.count("u") for r in ran.values()) == 1
    assert orch.displaced.inputs_regrown == 0 and "re-running t" not in log, log
    assert agents[to].data.stats["inputs_gone"] == 0


@pytest.mark.parametrize("to", ["c", "a"])
@pytest.mark.usefixtures("let_go")
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
    assert orch.displaced.inputs_regrown == 1
    assert f"{to}: input t of u is gone from a" in log and "re-running t" in log, log
    # u stays where it waits, booked again after t (its old window, before t's, would
    # refuse t's booking on a: round after round, then a wait to try again)
    assert "cannot re-place" not in log and done.tasks["u"].agent_id == to, log


@pytest.mark.usefixtures("let_go")
async def test_a_re_run_that_finds_no_room_is_tried_again(
    cluster: Cluster, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, with a (where t must run) draining too: t cannot run again, so the re-run
    fails and waits; once a takes work again it is tried again (every STUCK_RETRY_S) as the
    re-run it was, not as a dead agent's cancelled tasks (of which there are none: that
    retry re-placed nothing, and the pipeline waited for the stall watchdog)."""
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


@pytest.mark.usefixtures("let_go")
async def test_a_move_that_cannot_tell_an_ended_producer_still_gets_its_input(
    cluster: Cluster, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but t's end has not reached the orchestrator when u is re-placed: t's agent
    refuses to be told where u went (t is done there), which no re-plan can change. u's new
    offer says t's output is ready, so c asks for it at commit, finds it gone and says so;
    the report waits for t's end to be heard, and is acted on then. (The data plane's own
    sweep is out of the picture: only the fetch at commit can find the input gone.)"""
    monkeypatch.setattr(dataplane, "SWEEP_S", 3600.0)
    orch, agents = cluster
    heard = asyncio.Event()
    real = orch.apply_event

    async def late(ev: TaskEvent) -> None:
        if (ev.pipeline_id, ev.task_id, ev.state) == ("p", "t", "succeeded"):
            await heard.wait()
        await real(ev)

    orch.apply_event = late  # type: ignore[method-assign]

    async def parked(_run: PipelineRun) -> None:
        await orch.wait_for(lambda: ("p", "t") in orch.displaced.early, 10.0)
        heard.set()

    done = await move_as_t_ends(cluster, nats_url, [], parked, heard=False)
    log = "\n".join(done.placement_log)
    assert "t already ended or running on their agents; their consumers fetch" in log, log
    assert "re-placed after eviction: u" in log, log
    assert [x[1] for x in agents["a"].log] == ["t", "t"], log
    assert [x[1] for x in agents["c"].log] == ["u"], log
    assert orch.displaced.inputs_regrown == 1 and not orch.displaced.early


@pytest.mark.usefixtures("let_go")
async def test_a_producer_heard_ending_during_the_move_stays_ended(
    cluster: Cluster, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but t's end is heard while u's re-placement is still under way, after t's
    agent refused to be told where u went: the re-placement must not wind t back to
    `accepted` as it ends (t would then look free to start and never started, and its end,
    already heard, is not heard again), and u's input is made again."""
    monkeypatch.setattr(dataplane, "SWEEP_S", 3600.0)
    orch, agents = cluster
    heard = asyncio.Event()
    real_event, real_offers = orch.apply_event, orch.start_offers

    async def late(ev: TaskEvent) -> None:
        if (ev.pipeline_id, ev.task_id, ev.state) == ("p", "t", "succeeded"):
            await heard.wait()
        await real_event(ev)

    async def answered(offers: Sequence[TaskOffer]) -> list[OfferReply]:
        replies = await real_offers(offers)
        if any(o.task.id == "u" and o.inputs[0].ready for o in offers) and not heard.is_set():
            heard.set()  # u is told t's output is ready: now t's end is heard, mid-placement
            run = orch.pipelines["p"]
            await orch.wait_for(lambda: run.tasks["t"].state == "succeeded", 10.0)
        return replies

    def mid_placement(offers: Sequence[TaskOffer]) -> asyncio.Future[list[OfferReply]]:
        return asyncio.ensure_future(answered(offers))

    orch.apply_event = late  # type: ignore[method-assign]
    orch.start_offers = mid_placement  # type: ignore[method-assign]
    done = await move_as_t_ends(cluster, nats_url, [], nothing, heard=False)
    log = "\n".join(done.placement_log)
    assert "t already ended or running on their agents" in log, log
    assert [x[1] for x in agents["a"].log] == ["t", "t"], log
    assert [x[1] for x in agents["c"].log] == ["u"], log
    assert done.tasks["t"].state == "succeeded"


async def placed_with_true_report(orch: Orchestrator) -> tuple[PipelineRun, InputGone]:
    """Pipeline "p" placed (t on a, still to run; u waiting on b), and the report b would
    send if t's output were gone."""
    await orch.submit_spec(t_then_u(), "p")
    run = orch.pipelines["p"]
    u = run.tasks["u"]
    assert u.agent_id == "b"
    true = InputGone(pipeline_id="p", consumer="u", token=u.token, agent_id="b",
                     producer="t", producer_agent="a")  # fmt: skip
    return run, true


async def test_reports_that_do_not_hold_are_left_alone(cluster: Cluster) -> None:
    """A report about another placement of the consumer, a producer run elsewhere, a task
    that is no consumer of it, another pipeline (named, or the subject it came on), another
    agent than the consumer's (by the subject it came on), or bytes that are no report at
    all: nothing
    is re-run, and the service goes on. A report that comes before the producer's end is
    heard waits for it, and is forgotten with its pipeline. (The handler is called as the
    subscription calls it, so each report is handled when the call returns.)"""
    orch, agents = cluster
    run, true = await placed_with_true_report(orch)
    u = run.tasks["u"]
    wrong = [
        true.model_copy(update={"token": u.token + 1}),
        true.model_copy(update={"agent_id": "c"}),
        true.model_copy(update={"producer_agent": "b"}),  # t runs on a
        true.model_copy(update={"consumer": "t", "producer": "u"}),  # t is fed by nobody
        true.model_copy(update={"pipeline_id": "nope"}),
    ]

    nc = orch.nc
    assert nc is not None

    async def report(data: bytes) -> None:
        await orch.displaced.on_input_gone(
            Msg(nc, subjects.input_gone("p", true.agent_id), data=data)
        )

    for data in [*(encode(w) for w in wrong), b"\xff not a report", b"{}"]:
        await report(data)
    # the true report, published under another pipeline's subject
    await orch.displaced.on_input_gone(
        Msg(nc, subjects.input_gone("q", true.agent_id), data=encode(true))
    )
    # the true report, published by another agent than the consumer's (its subject names
    # the publisher), and in the older form naming none, which b (of this level) never uses
    for forged in (subjects.input_gone("p", "a"), f"{subjects.EVENTS}.input_gone.p"):
        await orch.displaced.on_input_gone(Msg(nc, forged, data=encode(true)))
    assert orch.displaced.misnamed_notices == 3  # and the one above naming c, sent by b
    assert orch.displaced.inputs_regrown == 0 and not orch.displaced.early
    assert not any("is gone" in x for x in run.placement_log)
    await report(encode(true))  # t is held on a: its end is still to come
    assert orch.displaced.early == {("p", "t"): (true, run.tasks["t"].token)}
    assert orch.displaced.inputs_regrown == 0
    await orch.queries.cancel(CancelRequest(pipeline_id="p"))
    assert not orch.displaced.early  # forgotten with its pipeline
    agents["a"].gates["t"].set()
    await orch.submit_spec(t_then_u(), "p2")
    assert (await orch.wait_terminal("p2", 10.0)).state == "succeeded"
    assert orch.displaced.inputs_regrown == 0


async def test_a_report_heard_while_the_lease_had_lapsed_is_acted_on_once_renewed(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A true report comes while the pipeline's lease has lapsed here and is still this
    replica's: kept, not acted on, and acted on once the lease is renewed (here: t's end is
    still to come, so it waits for it). Before, it was dropped, and u waited for the stall
    watchdog."""
    orch, agents = cluster
    renewing = hold_renewals(orch, monkeypatch)
    try:
        run, true = await placed_with_true_report(orch)
        orch.failover.leases.held["p"].valid_until = orch.mono()  # an unrenewed lease's lot
        nc = orch.nc
        assert nc is not None
        await orch.displaced.on_input_gone(
            Msg(nc, subjects.input_gone("p", true.agent_id), data=encode(true))
        )
        assert orch.displaced.parked == 1 and not orch.displaced.early  # kept, not acted on
        acted = asyncio.Event()
        resume = orch.displaced.resume

        async def resumed(pid: str) -> None:
            await resume(pid)
            if pid == "p":
                acted.set()

        monkeypatch.setattr(orch.displaced, "resume", resumed)
        renewing.set()
        await asyncio.wait_for(acted.wait(), 10.0)
        assert orch.failover.may_act("p") and orch.displaced.parked == 0
        assert orch.displaced.early == {("p", "t"): (true, run.tasks["t"].token)}
    finally:
        renewing.set()
        agents["a"].gates["t"].set()
    assert (await orch.wait_terminal("p", 10.0)).state == "succeeded"


async def test_reports_kept_while_the_lease_had_lapsed_go_with_the_pipeline(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report kept while the lease had lapsed is dropped when the pipeline is lost to
    another replica (its new owner hears what comes next; its audit and watchdog find the
    rest): nothing is kept for a pipeline this replica no longer drives."""
    orch, agents = cluster
    hold_renewals(orch, monkeypatch)
    try:
        run, true = await placed_with_true_report(orch)
        orch.failover.leases.held["p"].valid_until = orch.mono()  # an unrenewed lease's lot
        await orch.displaced.input_gone(true)
        assert orch.displaced.parked == 1
        orch.failover._lose("p", "adopted elsewhere (test)")
        assert orch.displaced.parked == 0 and "p" not in orch.pipelines
        await orch.displaced.resume("p")  # a renewal racing the loss acts on nothing
        assert not orch.displaced.early and not any("is gone" in x for x in run.placement_log)
    finally:
        agents["a"].gates["t"].set()


async def test_an_evicted_consumer_stays_on_its_device(cluster: Cluster) -> None:
    """u (to wait for t's output on b) is evicted by a higher-priority task on b before t
    ends. c would finish u sooner, but t, whose end this replica may not have heard, may
    have sent its output to b already: u is booked again on b, after the task that took its
    place, and t runs once."""
    orch, agents = cluster
    run_s = {"kind": "synthetic", "ref_gflops": 100.0, "output_bytes": 64}
    low = PipelineSpec.model_validate({"name": "p", "priority": 10, "preemptible": True, "tasks": [
        {"id": "t", "run": {**run_s, "seconds": 2.0}, "requires": {"pinned_agent": "a"}},
        {"id": "u", "run": {**run_s, "seconds": 0.02}, "deps": ["t"]},
    ]})  # fmt: skip
    await orch.submit_spec(low, "p")
    run = orch.pipelines["p"]
    assert (run.tasks["t"].agent_id, run.tasks["u"].agent_id) == ("a", "b")
    token = run.tasks["u"].token
    hog = {**run_s, "seconds": 30.0}  # 3 s on b: over u's window
    high = PipelineSpec.model_validate({"name": "h", "priority": 500, "tasks": [
        {"id": "h", "run": hog, "requires": {"pinned_agent": "b"}}]})  # fmt: skip
    await orch.submit_spec(high, "h")
    await orch.wait_for(lambda: any("after eviction: u" in x for x in run.placement_log), 10)
    assert run.tasks["u"].agent_id == "b" and run.tasks["u"].token > token, run.placement_log
    h = orch.pipelines["h"]
    assert run.t0 + run.placements["u"].start >= h.t0 + h.placements["h"].finish - 1e-3
    agents["a"].gates["t"].set()
    done = await orch.wait_terminal("p", 15.0)
    assert done.state == "succeeded", done.reason
    assert [x[1] for x in agents["a"].log] == ["t"] and [x[1] for x in agents["b"].log][-1] == "u"
    assert orch.displaced.inputs_regrown == 0
