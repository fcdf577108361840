"""The stall watchdog over a real nats-server: a task that never starts, or whose end never
reaches the orchestrator, does not hold its pipeline open for ever."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from nats.aio.msg import Msg

from edge_agent import dataplane, retention
from edge_agent.retention import Retained
from orchestrator.reliability import recovery
from orchestrator.reliability.displaced import Displaced
from orchestrator.reservations.store import device_key
from orchestrator.service import Orchestrator
from orchestrator.state.pipelines import PipelineRun
from schemas import PipelineSpec
from schemas.codec import decode
from schemas.events import TaskEvent
from schemas.placement import DataAck, DataTransfer
from tests.harness import EMULATED_CPU, RecordingAgent, agent_config, one_device_agent

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def outputs_let_go_once_delivered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inputs these tests lose are gone for good: a producer's agent keeps no output once
    every consumer acknowledged it (by default it keeps one a while, and a lost input is
    fetched from there instead of the producer running again)."""
    monkeypatch.setattr(retention, "DELIVERED_KEPT", 0)


def chain(*tasks: str) -> PipelineSpec:
    """Short synthetic tasks, each depending on the one before."""
    return PipelineSpec.model_validate({"name": "p", "tasks": [
        {"id": t, "run": {"kind": "synthetic", "seconds": 0.01}, "deps": list(tasks[:i][-1:])}
        for i, t in enumerate(tasks)
    ]})  # fmt: skip


class LossyOrchestrator(Orchestrator):
    """One whose live task-event path loses the events `lose` picks (noting their ids): a
    lossy link between the agents and this replica, while the stream keeps them."""

    def __init__(
        self, url: str, lose: Callable[[TaskEvent], bool], lost: list[str], **kw: Any
    ) -> None:
        super().__init__(url, **kw)
        self.lose, self.lost = lose, lost

    async def on_live_task_event(self, msg: Msg) -> None:
        ev = decode(msg.data, TaskEvent)
        if self.lose(ev):
            self.lost.append(ev.event_id)
            return
        await super().on_live_task_event(msg)


@contextlib.asynccontextmanager
async def one_agent(
    nats_url: str, lose: Callable[[TaskEvent], bool] | None = None, stall_s: float = 0.4
) -> AsyncIterator[tuple[Orchestrator, RecordingAgent, list[str]]]:
    """An orchestrator (stall time `stall_s`) whose live task-event path drops the events
    `lose` picks (their ids are listed), and one agent."""
    lost: list[str] = []
    orch = (
        Orchestrator(nats_url, stall_s=stall_s)
        if lose is None
        else LossyOrchestrator(nats_url, lose, lost, stall_s=stall_s)
    )
    await orch.start()
    agent = await one_device_agent(nats_url)
    try:
        assert await orch.wait_for_agents(1, timeout=10.0) == 1
        yield orch, agent, lost
    finally:
        await agent.stop()
        await orch.stop()


def silence_input_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Agents from before `InputGone`: they say nothing of an input found gone (what an
    orchestrator hears of it, here: nothing)."""

    async def unheard(*_a: object) -> None:
        return None

    monkeypatch.setattr(Displaced, "on_input_gone", unheard)


@contextlib.asynccontextmanager
async def forgetful_pair(
    nats_url: str, stall_s: float, drain: Callable[[str], list[str]]
) -> AsyncIterator[tuple[Orchestrator, dict[str, RecordingAgent], list[str]]]:
    """An orchestrator (stall time `stall_s`) and agents a and b; the first agent to receive
    u's input acknowledges it, loses it (its id is listed) and drains the agents `drain`
    names for it."""
    orch = Orchestrator(nats_url, stall_s=stall_s)
    await orch.start()
    config = agent_config("s1", "edge", probe_cpu=False, devices=[EMULATED_CPU])
    agents = {n: RecordingAgent(nats_url, config, agent_id=n, calibrate=False) for n in "ab"}
    lost: list[str] = []

    def forgetful(agent: RecordingAgent) -> Callable[..., DataAck]:
        real = agent.core.deliver

        def deliver(msg: DataTransfer, data: bytes | None = None) -> DataAck:
            if msg.consumer == "u" and not lost:
                lost.append(agent.agent_id)
                for name in drain(agent.agent_id):  # new offers go elsewhere from now on
                    agents[name].drain()
                return DataAck(pipeline_id=msg.pipeline_id, consumer=msg.consumer, ok=True)
            return real(msg, data)

        return deliver

    for a in agents.values():
        a.core.deliver = forgetful(a)  # type: ignore[method-assign]
        await a.start()
    try:
        assert await orch.wait_for_agents(2, timeout=10.0) == 2
        yield orch, agents, lost
    finally:
        for a in agents.values():
            await a.stop()
        await orch.stop()


async def run_to_end(orch: Orchestrator, spec: PipelineSpec) -> PipelineRun:
    await orch.submit_spec(spec, "p")
    run = await orch.wait_terminal("p", 10.0)
    assert run.state == "succeeded", run.reason
    return run


async def test_a_commit_taken_but_not_acted_on_is_sent_again(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with one_agent(nats_url) as (orch, agent, _):
        dropped = agent.forget_first_commit()
        with caplog.at_level(logging.WARNING, logger="mars"):
            run = await run_to_end(orch, chain("t"))
        assert dropped == [["t"]]
        assert [r for r in caplog.records if "free to start" in r.getMessage()]
        assert any(line.startswith("stalled, commit sent again: t") for line in run.placement_log)


async def test_task_events_the_live_subscription_missed_are_read_from_the_stream(
    nats_url: str,
) -> None:
    """The task ran and its events reached MARS_EVENTS, but not the orchestrator's live
    subscription: the watchdog replays the pipeline's events and the pipeline ends."""
    async with one_agent(nats_url, lambda ev: ev.task_id == "t") as (orch, _, lost):
        run = await run_to_end(orch, chain("t", "u"))
        assert lost  # the live path really lost them
        assert run.tasks["t"].state == "succeeded"  # known only from the stream


async def test_a_lost_end_event_is_read_from_the_stream(nats_url: str) -> None:
    """Task t's start reached the orchestrator, its end only the stream: t is overdue after
    the stall time plus a few predicted durations, and the watchdog reads the events again."""
    lose_end = lambda ev: ev.task_id == "t" and ev.state == "succeeded"  # noqa: E731
    async with one_agent(nats_url, lose_end) as (orch, _, lost):
        await run_to_end(orch, chain("t"))
        assert lost


async def test_an_input_lost_on_its_way_is_fetched_when_the_commit_is_sent_again(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """t's output never reaches u (its push is lost) and the data plane's own sweep is out of
    the picture: u is free to start but cannot, the watchdog sends its commit again, and the
    agent, committed twice, asks for the missing input at once."""
    monkeypatch.setattr(dataplane, "SWEEP_S", 3600.0)
    async with one_agent(nats_url) as (orch, agent, _):
        real = agent.data.push_all
        lost: list[str] = []

        async def lossy(entry: Retained) -> None:
            if entry.unacked() and not lost:
                lost.extend(entry.unacked())  # the first push goes nowhere
                return
            await real(entry)

        agent.data.push_all = lossy  # type: ignore[method-assign]
        run = await run_to_end(orch, chain("t", "u"))
        assert lost == ["u"]
        assert any(line.startswith("stalled, commit sent again: u") for line in run.placement_log)
        assert agent.data.stats["inputs"] == 1  # delivered by the fetch, not the lost push


@pytest.mark.parametrize("reported", [True, False], ids=["reported", "older-agent"])
async def test_an_input_gone_for_good_is_made_again(
    nats_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    reported: bool,
) -> None:
    """u's agent acknowledges t's output but loses it, so t's agent lets the output go: asking
    u to start again cannot help (nobody holds the input). The agent, asked again, looks for
    the input, finds it gone and says so, and t is run again at once; an agent that does not
    say so (one from before `InputGone`) is found out by the watchdog two looks later."""
    monkeypatch.setattr(dataplane, "SWEEP_S", 3600.0)
    if not reported:
        silence_input_gone(monkeypatch)
    async with one_agent(nats_url) as (orch, agent, _):
        real = agent.core.deliver
        lost: list[str] = []

        def forgetful(msg: DataTransfer, data: bytes | None = None) -> DataAck:
            if msg.consumer == "u" and not lost:
                lost.append(msg.producer)  # acknowledged, then gone
                return DataAck(pipeline_id=msg.pipeline_id, consumer=msg.consumer, ok=True)
            return real(msg, data)

        agent.core.deliver = forgetful  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="mars"):
            run = await run_to_end(orch, chain("t", "u"))
        assert lost == ["t"]
        assert [task for (_, task, *_rest) in agent.log] == ["t", "t", "u"]  # t made again
        watchdog = [r for r in caplog.records if "still not started" in r.getMessage()]
        assert bool(watchdog) != reported
        assert orch.displaced.inputs_regrown == int(reported)
        said = "input t of u is gone from a1: re-running t" if reported else "starved of inputs: u"
        assert any(said in x and "re-running t" in x for x in run.placement_log)
        assert run.results_committed == 2  # t's second result is the same task's: dropped


async def test_every_lost_input_of_a_consumer_is_made_again_at_once(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """u's agent takes both t1's and t2's outputs and loses them. Asked again, it finds both
    gone and reports each; the first report has both producers run again in one
    re-placement (each no longer holds its output), and the second, about a placement of u
    that is no more once that re-placement has booked u again, does nothing: nothing runs a
    third time."""
    monkeypatch.setattr(dataplane, "SWEEP_S", 3600.0)
    spec = PipelineSpec.model_validate({"name": "p", "tasks": [
        {"id": "t1", "run": {"kind": "synthetic", "seconds": 0.01}},
        {"id": "t2", "run": {"kind": "synthetic", "seconds": 0.01}},
        {"id": "u", "run": {"kind": "synthetic", "seconds": 0.01}, "deps": ["t1", "t2"]},
    ]})  # fmt: skip
    async with one_agent(nats_url) as (orch, agent, _):
        real = agent.core.deliver
        lost: list[str] = []

        def forgetful(msg: DataTransfer, data: bytes | None = None) -> DataAck:
            if msg.consumer == "u" and len(lost) < 2:
                lost.append(msg.producer)  # acknowledged, then gone
                return DataAck(pipeline_id=msg.pipeline_id, consumer=msg.consumer, ok=True)
            return real(msg, data)

        agent.core.deliver = forgetful  # type: ignore[method-assign]
        run = await run_to_end(orch, spec)
        assert sorted(lost) == ["t1", "t2"]
        ran = [task for (_, task, *_rest) in agent.log]
        assert sorted(ran) == ["t1", "t1", "t2", "t2", "u"] and ran[-1] == "u"
        regrown = [x for x in run.placement_log if "is gone" in x]
        assert len(regrown) == 1 and "re-running t1, t2" in regrown[0], run.placement_log


async def test_a_starved_task_placed_elsewhere_is_withdrawn_from_its_old_agent(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, with agents that do not report inputs gone (from before `InputGone`), and
    u's agent draining as it loses the input: the watchdog finds u starved, u and t are made
    again on the other agent, and u's old job is withdrawn, not left behind waiting for an
    input that will never come."""
    monkeypatch.setattr(dataplane, "SWEEP_S", 3600.0)
    silence_input_gone(monkeypatch)
    async with forgetful_pair(nats_url, 0.4, lambda me: [me]) as (orch, agents, lost):
        run = await run_to_end(orch, chain("t", "u"))
        [home] = lost  # u's first agent, which lost t's output
        other = next(n for n in agents if n != home)
        ran = {n: [task for (_, task, *_rest) in a.log] for n, a in agents.items()}
        assert ran[other][-1] == "u" and "u" not in ran[home]  # u ran once, on the other
        assert ran[home].count("t") + ran[other].count("t") == 2  # t made again
        assert run.tasks["u"].agent_id == other
        assert ("p", "u") not in agents[home].core.jobs  # withdrawn, not left waiting
        # and its window there given back (nothing would renew or release it any more)
        left = orch.store.snapshot().get(device_key(home, "cpu0"))
        assert left is None or not [w for w in left.book.windows if w.pipeline_id == "p"]


async def test_a_starved_re_placement_that_finds_no_room_is_tried_again(
    nats_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As above, but both agents drain as u loses its input: the watchdog finds u starved
    and nothing can take it or t. Once the other agent takes work again, the re-placement is
    tried again within STUCK_RETRY_S as the starved one it was (that retry used to look for
    a dead agent's cancelled tasks, found none, re-placed nothing, and the pipeline waited
    for the watchdog to find u starved a second time)."""
    monkeypatch.setattr(dataplane, "SWEEP_S", 3600.0)
    monkeypatch.setattr(recovery, "STUCK_RETRY_S", 0.2)
    silence_input_gone(monkeypatch)
    # stall_s 2: a second starved verdict would take two more looks (~2 s), the retry 0.2 s
    async with forgetful_pair(nats_url, 2.0, lambda _me: ["a", "b"]) as (orch, agents, lost):
        with caplog.at_level(logging.WARNING, logger="mars"):
            await orch.submit_spec(chain("t", "u"), "p")
            run = orch.pipelines["p"]
            await orch.wait_for(lambda: any("cannot re-place" in x for x in run.placement_log), 15)
            [home] = lost
            other = next(n for n in agents if n != home)
            agents[other].resume()
            done = await orch.wait_terminal("p", 10.0)
        assert done.state == "succeeded", done.reason
        starved = [r for r in caplog.records if "still not started" in r.getMessage()]
        assert len(starved) == 1, "found starved again: the retry did not re-place it"
        assert run.tasks["u"].agent_id == other


async def test_replays_are_bounded_when_every_pipeline_looks_stalled(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No task event reaches the live path: every pipeline ends through a replay, and no more
    than MAX_REPLAYS of them are under way at once (an overloaded orchestrator, whose every
    pipeline looks stalled, is not buried under its own replays)."""
    import asyncio

    from orchestrator.reliability import watchdog

    monkeypatch.setattr(watchdog, "MAX_REPLAYS", 2)
    async with one_agent(nats_url, lambda ev: True) as (orch, _, lost):
        real = orch.failover.replay
        running: list[str] = []
        most = [0]
        started = asyncio.Condition()
        looked = asyncio.Event()

        async def held(run: PipelineRun) -> int:
            """A replay kept under way until the test has had its look."""
            running.append(run.pipeline_id)
            most[0] = max(most[0], len(running))
            async with started:
                started.notify_all()
            try:
                await looked.wait()
                return await real(run)
            finally:
                running.remove(run.pipeline_id)

        orch.failover.replay = held  # type: ignore[method-assign]
        pids = [f"p{i}" for i in range(8)]
        for pid in pids:
            await orch.submit_spec(chain("t"), pid)
        async with asyncio.timeout(10), started:
            await started.wait_for(lambda: len(running) >= 2)
        orch.watchdog.check()  # another look while two are under way: it starts none
        assert len(orch.watchdog.replaying) == 2
        looked.set()
        for pid in pids:
            run = await orch.wait_terminal(pid, 20.0)
            assert run.state == "succeeded", run.reason
        assert len(lost) >= len(pids)  # each one's end went by the live path unheard
        assert most[0] == 2  # bounded, and used


async def test_the_watchdog_does_not_judge_while_task_events_are_behind(nats_url: str) -> None:
    """An orchestrator behind on its task events knows its tasks only as they were: a task
    that looks stalled then may long be done. The watchdog skips its look, and judges once the
    events are handled."""
    # stall time an hour: the watchdog takes no look of its own during the test
    async with one_agent(nats_url, stall_s=3600.0) as (orch, agent, _):
        agent.core.commit = lambda cmd: 0  # type: ignore[method-assign]  # never acted on
        await orch.submit_spec(chain("t"), "p")
        run = orch.pipelines["p"]
        real_now = orch.mono
        orch.mono = lambda: real_now() + 7200.0  # type: ignore[method-assign]  # long after
        assert run.stalled(orch.mono(), 3600.0) == ["t"]
        orch.events_backlog = lambda: 10**6  # type: ignore[method-assign]  # far behind
        orch.watchdog.check()
        assert orch.watchdog.skipped == 1
        assert not any(line.startswith("stalled") for line in run.placement_log)
        del orch.events_backlog  # caught up: the same look judges it stalled
        orch.watchdog.check()
        assert orch.watchdog.skipped == 1
        assert any(line.startswith("stalled, commit sent again: t") for line in run.placement_log)
