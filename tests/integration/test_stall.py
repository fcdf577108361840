"""A task free to start that never starts is noticed and its agent asked again (real
nats-server): the orchestrator must not hold a pipeline open for ever on one lost message."""

from __future__ import annotations

import logging

import pytest

from orchestrator.service import Orchestrator
from schemas import PipelineSpec
from schemas.placement import CommitCommand
from tests.harness import RecordingAgent, agent_config

pytestmark = pytest.mark.integration

DEVICE = {"device_id": "cpu0", "kind": "cpu", "gflops": 100.0, "emulated": True}


async def test_a_commit_taken_but_not_acted_on_is_sent_again(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    orch = Orchestrator(nats_url, stall_s=0.4)
    await orch.start()
    agent = RecordingAgent(
        nats_url, agent_config("s1", "edge", probe_cpu=False, devices=[DEVICE]),
        agent_id="a1", calibrate=False,
    )  # fmt: skip
    await agent.start()
    try:
        assert await orch.wait_for_agents(1, timeout=10.0) == 1
        real = agent.core.commit
        dropped: list[list[str]] = []

        def forgetful(cmd: CommitCommand) -> int:
            """Answers the first commit but does not act on it (as if it were lost)."""
            if not dropped:
                dropped.append(list(cmd.task_ids))
                return 0
            return real(cmd)

        agent.core.commit = forgetful  # type: ignore[method-assign]
        spec = PipelineSpec.model_validate(
            {"name": "p", "tasks": [{"id": "t", "run": {"kind": "synthetic", "seconds": 0.01}}]}
        )
        with caplog.at_level(logging.WARNING, logger="mars"):
            await orch.submit_spec(spec, "p")
            run = await orch.wait_terminal("p", 10.0)
        assert run.state == "succeeded", run.reason
        assert dropped == [["t"]]
        assert [r for r in caplog.records if "free to start" in r.getMessage()]
        assert any(line.startswith("stalled, commit sent again: t") for line in run.placement_log)
    finally:
        await agent.stop()
        await orch.stop()


async def test_task_events_the_live_subscription_missed_are_read_from_the_stream(
    nats_url: str,
) -> None:
    """The task ran and its events reached MARS_EVENTS, but not the orchestrator's live
    subscription: the watchdog replays the pipeline's events and the pipeline ends."""
    from nats.aio.msg import Msg

    orch = Orchestrator(nats_url, stall_s=0.4)
    live = orch._on_live_task_event
    missed: list[str] = []

    async def lossy(msg: Msg) -> None:
        if msg.subject.endswith(".t"):  # every live event of task t is lost
            missed.append(msg.subject)
            return
        await live(msg)

    orch._on_live_task_event = lossy  # type: ignore[method-assign]  # before start subscribes
    await orch.start()
    agent = RecordingAgent(
        nats_url, agent_config("s1", "edge", probe_cpu=False, devices=[DEVICE]),
        agent_id="a1", calibrate=False,
    )  # fmt: skip
    await agent.start()
    try:
        assert await orch.wait_for_agents(1, timeout=10.0) == 1
        spec = PipelineSpec.model_validate({"name": "p", "tasks": [
            {"id": "t", "run": {"kind": "synthetic", "seconds": 0.01}},
            {"id": "u", "run": {"kind": "synthetic", "seconds": 0.01}, "deps": ["t"]},
        ]})  # fmt: skip
        await orch.submit_spec(spec, "p")
        run = await orch.wait_terminal("p", 10.0)
        assert run.state == "succeeded", run.reason
        assert missed  # the live path really lost them
        assert run.tasks["t"].state == "succeeded"  # known only from the stream
    finally:
        await agent.stop()
        await orch.stop()


async def test_a_lost_end_event_is_read_from_the_stream(nats_url: str) -> None:
    """Task t's start reached the orchestrator, its end only the stream: t is overdue after
    the stall time plus a few predicted durations, and the watchdog reads the events again."""
    from nats.aio.msg import Msg

    from schemas.codec import decode
    from schemas.events import TaskEvent

    orch = Orchestrator(nats_url, stall_s=0.4)
    live = orch._on_live_task_event
    missed: list[str] = []

    async def lossy(msg: Msg) -> None:
        ev = decode(msg.data, TaskEvent)
        if ev.task_id == "t" and ev.state == "succeeded":
            missed.append(ev.event_id)
            return
        await live(msg)

    orch._on_live_task_event = lossy  # type: ignore[method-assign]  # before start subscribes
    await orch.start()
    agent = RecordingAgent(
        nats_url, agent_config("s1", "edge", probe_cpu=False, devices=[DEVICE]),
        agent_id="a1", calibrate=False,
    )  # fmt: skip
    await agent.start()
    try:
        assert await orch.wait_for_agents(1, timeout=10.0) == 1
        spec = PipelineSpec.model_validate(
            {"name": "p", "tasks": [{"id": "t", "run": {"kind": "synthetic", "seconds": 0.01}}]}
        )
        await orch.submit_spec(spec, "p")
        run = await orch.wait_terminal("p", 10.0)
        assert run.state == "succeeded", run.reason
        assert missed  # the end really missed the live path
    finally:
        await agent.stop()
        await orch.stop()
