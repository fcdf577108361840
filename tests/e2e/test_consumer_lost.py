"""An output stays kept until the consumer that will actually run has it, with real agent
processes: the consumer's agent takes the producer's output, starts the consumer and dies; the
consumer is placed again elsewhere and gets the output from the producer's agent, which kept
it though the dead agent had acknowledged it. The producer runs once."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import nats
import pytest

from orchestrator.service import Orchestrator
from schemas import PipelineSpec, subjects
from schemas.codec import decode
from schemas.events import TaskEvent
from tests.harness import AgentProcesses
from transport.rpc import settle

pytestmark = pytest.mark.e2e


async def test_a_consumer_lost_after_taking_its_input_does_not_make_the_producer_run_again(
    nats_url: str, tmp_path: Path
) -> None:
    orch = Orchestrator(nats_url)
    await orch.start()
    nc = await nats.connect(nats_url)
    ends: list[TaskEvent] = []
    started: dict[tuple[str, str], asyncio.Event] = {}

    async def on_event(msg: Any) -> None:
        ev = decode(msg.data, TaskEvent)
        if ev.state == "succeeded":
            ends.append(ev)
        if ev.state == "started":
            started.setdefault((ev.task_id, ev.agent_id), asyncio.Event()).set()

    await nc.subscribe(subjects.task_events_of("lost-c"), cb=on_event)
    await settle(nc)
    try:
        async with AgentProcesses(nats_url, tmp_path) as fleet:
            await fleet.start("prod", labels={"role": "p"})
            doomed = await fleet.start("fast", gflops=20.0, labels={"role": "c"})
            await fleet.start("slow", gflops=5.0, labels={"role": "c"})
            assert await orch.wait_for_agents(3, timeout=30.0) == 3
            syn = {"kind": "synthetic", "ref_gflops": 10.0}
            spec = PipelineSpec.model_validate({"name": "lost-c", "tasks": [
                {"id": "a", "run": {**syn, "seconds": 0.2}, "output_bytes": 1000,
                 "requires": {"labels": {"role": "p"}}},
                {"id": "c", "run": {**syn, "seconds": 2.0}, "deps": ["a"],
                 "requires": {"labels": {"role": "c"}}},
            ]})  # fmt: skip
            await orch.submit_spec(spec, "lost-c")
            assert orch.pipelines["lost-c"].tasks["c"].agent_id == "fast"
            # c started on fast: it took a's output (and acknowledged it) first
            await asyncio.wait_for(started.setdefault(("c", "fast"), asyncio.Event()).wait(), 15)
            doomed.send_signal(signal.SIGKILL)
            run = await orch.wait_terminal("lost-c", 30.0)
            assert run.state == "succeeded", run.reason
            assert run.tasks["c"].agent_id == "slow"
            runs_of_a = {(e.agent_id, e.token) for e in ends if e.task_id == "a"}
            assert len(runs_of_a) == 1, (runs_of_a, run.placement_log)
            assert not [x for x in run.placement_log if "re-running a" in x], run.placement_log
    finally:
        await nc.close()
        await orch.stop()
