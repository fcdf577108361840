"""Adaptive re-scheduling over a real nats-server: a device that slows down mid-pipeline gets
its queued work moved away only when the gain rule says so, and never a non-migratable task."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from orchestrator.reliability.adaptive import GAIN_FACTOR, Decision
from orchestrator.service import Orchestrator
from schemas import PipelineSpec
from schemas.agent import CalibrationDrift
from tests.harness import RecordingAgent, agent_config, start_cluster, stop_cluster
from tests.integration.test_failover import EventTap

pytestmark = pytest.mark.integration

#: 1 MB takes 0.1 s + 1.0 s between the two sites.
WAN = {"latency_ms": 100.0, "bandwidth_mbps": 8.0}


def configs() -> dict[str, Any]:
    def dev(kind: str, gflops: float) -> dict[str, Any]:
        return {"device_id": f"{kind}0", "kind": kind, "gflops": gflops, "emulated": True}

    return {
        "a-cpu": agent_config("s1", "edge", probe_cpu=False, devices=[dev("cpu", 100.0)],
                              links=[{"to_site": "s2", **WAN}]),
        "c-npu": agent_config("s1", "edge", probe_cpu=False, devices=[dev("npu", 50.0)],
                              links=[{"to_site": "s2", **WAN}]),
        "b-cpu": agent_config("s2", "edge", probe_cpu=False, devices=[dev("cpu", 100.0)],
                              links=[{"to_site": "s1", **WAN}]),
    }  # fmt: skip


def spec(migratable: bool = True) -> PipelineSpec:
    """`work` needs `gate`'s 1 MB, made on the NPU at site s1, so the plan puts it on a-cpu
    next to it; b-cpu, as fast but across the WAN (1.1 s for that 1 MB), is the alternative."""

    def syn(seconds: float, out: int = 0, ref: float | None = None) -> dict[str, Any]:
        return {"kind": "synthetic", "seconds": seconds, "output_bytes": out, "ref_gflops": ref}

    return PipelineSpec.model_validate({"name": "adaptive", "tasks": [
        {"id": "gate", "run": syn(1.5, 1_000_000), "requires": {"kinds": ["npu"]}},
        {"id": "work", "run": syn(1.0, 0, 100.0), "requires": {"kinds": ["cpu"]},
         "deps": ["gate"], "migratable": migratable},
    ]})  # fmt: skip


async def slow_down(agent: RecordingAgent, gflops: float) -> None:
    """The agent's own drift path: a notice on its drift subject, then the new advert."""
    dev = agent.devices[0]
    notice = CalibrationDrift(
        agent_id=agent.agent_id,
        incarnation=agent.incarnation,
        device_id=dev.device_id,
        baseline=dev.gflops,
        previous=dev.gflops,
        current=gflops,
        change=gflops / dev.gflops - 1.0,
    )
    await agent._on_drift([(dev.model_copy(update={"gflops": gflops}), notice)])


async def work_to_b(orch: Orchestrator) -> None:
    """What an eviction's re-placement does, for "work", to b-cpu."""
    run = orch.pipelines["p"]
    async with orch.recovery.lock("p"):
        old = {"work": run.placements["work"]}
        away = {("work", "a-cpu:cpu0"), ("work", "c-npu:npu0")}
        await orch.placer.place(run, only={"work"}, exclude=away)
        await orch.cancel_tasks(run, old, "moved by the test")
        await orch.commits.commit_all(run, {"work"})
        await orch.displaced.reroute_producers(run, old)


async def run_with_drift(
    nats_url: str,
    gflops: float,
    migratable: bool = True,
    busy: bool = False,
    meanwhile: Callable[[Orchestrator], Awaitable[None]] | None = None,
) -> Any:
    """`busy`: another re-placement of the pipeline holds its recovery lock meanwhile;
    `meanwhile`: done while the drift is priced (in its first turn of the event loop)."""
    orch, agents = await start_cluster(nats_url, configs())
    by_id = {a.agent_id: a for a in agents}
    tap = EventTap()
    if meanwhile is not None:
        adaptive, hook = orch.adaptive, meanwhile
        give_turn = adaptive.give_turn

        async def first_turn() -> None:
            adaptive.give_turn = give_turn
            await hook(orch)
            await give_turn()

        adaptive.give_turn = first_turn
    try:
        await tap.start(nats_url, "p")
        reply = await orch.submit_spec(spec(migratable), "p")
        assert {t.task_id: t.agent_id for t in reply.plan}["work"] == "a-cpu"
        await tap.wait("gate", "started")  # work is queued on a-cpu, its input not made yet
        lock = orch.recovery.lock("p")
        if busy:
            await lock.acquire()
        await slow_down(by_id["a-cpu"], gflops)
        await orch.wait_for(lambda: len(orch.adaptive.decisions) >= 1, 10.0)
        if busy:
            lock.release()
        run = await orch.wait_terminal("p", 30.0)
        assert run.state == "succeeded", run.reason
        where = {rec[1]: aid for aid, a in by_id.items() for rec in a.log}
        assert sorted(rec[1] for a in agents for rec in a.log) == ["gate", "work"]
        decisions: list[Decision] = list(orch.adaptive.decisions)
        return decisions, where, run
    finally:
        await tap.close()
        await stop_cluster(orch, agents)


async def test_a_much_slower_device_moves_its_queued_work(nats_url: str) -> None:
    decisions, where, run = await run_with_drift(nats_url, 10.0)
    [d] = decisions
    assert d.trigger.startswith("drift(a-cpu:cpu0 100->10")
    assert d.replan and d.moved == ("work",)
    assert d.gain_s > GAIN_FACTOR * d.cost_s
    assert d.cost_s > 1.0  # gate's 1 MB must cross the WAN
    assert where["work"] == "b-cpu"
    assert d.line() in run.placement_log


async def test_no_move_is_made_beside_another_re_placement(nats_url: str) -> None:
    """The same gain, decided while an eviction's or a recovery's re-placement of the
    pipeline holds its lock: two would re-place the same tasks over each other's records;
    the move is left to that one (which plans on the cluster as it is now)."""
    decisions, where, run = await run_with_drift(nats_url, 10.0, busy=True)
    [d] = decisions
    assert d.replan and d.moved == ("work",)  # decided as before
    assert where["work"] == "a-cpu"  # and not carried out
    assert "adaptive: not moved: another re-placement of the pipeline is under way" in (
        run.placement_log
    )


async def test_a_move_priced_on_placements_gone_is_not_made(nats_url: str) -> None:
    """While the drift is priced, "work" is re-placed by something else (as an eviction
    would): the decision was made on placements that are gone, and is not carried out."""
    decisions, where, run = await run_with_drift(nats_url, 10.0, meanwhile=work_to_b)
    [d] = decisions
    assert d.replan and d.moved == ("work",)
    assert "adaptive: not moved: work changed while priced" in run.placement_log
    assert where["work"] == "b-cpu"  # where the other re-placement put it, once


async def test_a_small_gain_does_not_pay_for_the_move(nats_url: str) -> None:
    decisions, where, run = await run_with_drift(nats_url, 40.0)
    [d] = decisions
    # moving would finish sooner, but not by twice what shipping gate's output costs
    assert d.moved == ("work",) and not d.replan
    assert 0.0 < d.gain_s <= GAIN_FACTOR * d.cost_s
    assert where["work"] == "a-cpu"
    assert any("decision=keep" in line for line in run.placement_log)


async def test_a_non_migratable_task_is_never_moved(nats_url: str) -> None:
    decisions, where, _ = await run_with_drift(nats_url, 10.0, migratable=False)
    [d] = decisions
    assert not d.replan and d.moved == ()
    assert where["work"] == "a-cpu"


async def test_a_task_running_late_is_priced_and_logged(nats_url: str) -> None:
    orch, agents = await start_cluster(nats_url, configs())
    a = next(x for x in agents if x.agent_id == "a-cpu")
    # the device runs at a fifth of its advertised speed and says nothing (no drift notice)
    dev = a.core.devices["cpu0"]
    a.core.devices["cpu0"] = dev.model_copy(update={"gflops": 20.0})
    try:
        late = PipelineSpec.model_validate({"name": "late", "tasks": [
            {"id": "lead", "requires": {"pinned_agent": "a-cpu"},
             "run": {"kind": "synthetic", "seconds": 0.3, "ref_gflops": 100.0}},
        ]})  # fmt: skip
        await orch.submit_spec(late, "late-1")
        await orch.wait_for(lambda: len(orch.adaptive.decisions) >= 1, 10.0)
        d = orch.adaptive.decisions[0]
        assert d.trigger.startswith("late(lead@a-cpu:cpu0")
        assert not d.replan  # pinned to its agent: nowhere else to go
        run = await orch.wait_terminal("late-1", 10.0)
        assert run.state == "succeeded" and d.line() in run.placement_log
    finally:
        await stop_cluster(orch, agents)


async def test_a_task_overrunning_more_and_more_gets_its_successor_moved(
    nats_url: str,
) -> None:
    """`lead` (pinned to a-cpu) is predicted at 0.6 s and runs 6 s: a-cpu is ten times
    slower than it says, and says nothing. `next`, booked after it on a-cpu, would wait for
    it; b-cpu, slower on paper, is idle. At the first look the overrun is small and moving
    `next` does not pay; the late task is looked at again as its overrun grows, and once the
    gain rule says so, `next` moves to b-cpu."""
    cfgs = {
        "a-cpu": agent_config("s1", "edge", probe_cpu=False, devices=[
            {"device_id": "cpu0", "kind": "cpu", "gflops": 100.0, "emulated": True}]),
        "b-cpu": agent_config("s1", "edge", probe_cpu=False, devices=[
            {"device_id": "cpu0", "kind": "cpu", "gflops": 22.0, "emulated": True}]),
    }  # fmt: skip
    orch, agents = await start_cluster(nats_url, cfgs)
    a = next(x for x in agents if x.agent_id == "a-cpu")
    dev = a.core.devices["cpu0"]
    a.core.devices["cpu0"] = dev.model_copy(update={"gflops": 10.0})
    try:
        syn = {"kind": "synthetic", "ref_gflops": 100.0}
        spec = PipelineSpec.model_validate({"name": "overrun", "tasks": [
            {"id": "lead", "requires": {"pinned_agent": "a-cpu"}, "run": {**syn, "seconds": 0.6}},
            {"id": "next", "run": {**syn, "seconds": 0.2}},
        ]})  # fmt: skip
        await orch.submit_spec(spec, "overrun")
        run = orch.pipelines["overrun"]
        assert run.tasks["next"].agent_id == "a-cpu"  # planned behind lead, on the faster
        done = await orch.wait_terminal("overrun", 15.0)
        assert done.state == "succeeded", done.reason
        late = [d for d in orch.adaptive.decisions if d.trigger.startswith("late(lead@")]
        assert len(late) >= 2 and not late[0].replan, [d.line() for d in late]
        assert any(d.replan for d in late), [d.line() for d in late]
        assert done.tasks["next"].agent_id == "b-cpu", done.placement_log
        assert [x[1] for x in a.log] == ["lead"]
    finally:
        await stop_cluster(orch, agents)


async def test_a_consumer_reported_started_before_its_producer_finished_is_priced(
    nats_url: str,
) -> None:
    """Events from two agents arrive in any order: `work` may be reported started while
    `gate`'s own events are still on their way. Pricing treats `gate` as finished by then
    (it used to fail: "fixed 'work' has predecessors that are not fixed")."""
    from orchestrator.reliability.adaptive import Trigger

    orch, agents = await start_cluster(nats_url, configs())
    try:
        await orch.submit_spec(spec(), "p")
        run = orch.pipelines["p"]
        gate, work = run.tasks["gate"], run.tasks["work"]
        saved = [(t.state, t.started_s) for t in (gate, work)]
        # no await from here to the restore: the event loop cannot apply real events between
        gate.state, gate.started_s = "accepted", None
        work.state, work.started_s = "started", 0.01
        s = orch.adaptive.situation(run, Trigger("late", "work", {}, late_task="work"))
        (gate.state, gate.started_s), (work.state, work.started_s) = saved
        assert s is not None
        assert set(s.running) == {"work"} and set(s.done) == {"gate"}
        assert s.done["gate"].finish <= s.running["work"].start
        assert s.done["gate"].device_id == run.placements["gate"].device_id
        run = await orch.wait_terminal("p", 30.0)
        assert run.state == "succeeded", run.reason
    finally:
        await stop_cluster(orch, agents)


async def test_pricing_gives_the_event_loop_turns(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pricing is a few plans' worth of CPU: work that became ready while it ran (a placement's
    reply) runs before the decision, not after the whole pricing."""
    import asyncio

    import orchestrator.reliability.adaptive as adaptive

    turns: list[str] = []
    situation, decide = adaptive.Adaptive.situation, adaptive.decide

    def situation_then_ready(self: Any, *args: Any, **kw: Any) -> Any:
        asyncio.get_running_loop().call_soon(turns.append, "ready")
        return situation(self, *args, **kw)

    def decide_after(*args: Any, **kw: Any) -> Any:
        turns.append("decide")
        return decide(*args, **kw)

    monkeypatch.setattr(adaptive.Adaptive, "situation", situation_then_ready)
    monkeypatch.setattr(adaptive, "decide", decide_after)
    decisions, _where, _run = await run_with_drift(nats_url, 20.0)
    assert decisions and "decide" in turns
    assert turns.index("ready") < turns.index("decide")
