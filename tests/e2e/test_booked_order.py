"""The plan is what runs: agents run tasks in the order of their booked windows, across
pipelines, with real agent processes.

Two agents of one emulated 1-slot device each. A low-priority pipeline of six tasks fills
them; a moment later a high-priority pipeline arrives, and a third one at priority 5. Booked
after the low pipeline's windows (it is not preemptible), the high pipeline's tasks run after
them, not ahead of them because each is first in its own plan; the priority-5 one runs last.
When the low pipeline is preemptible, the high one takes its later windows and starts sooner.
"""

from __future__ import annotations

import asyncio
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

TASK_S = 1.0


def _pipeline(name: str, n: int, priority: int, preemptible: bool) -> PipelineSpec:
    return PipelineSpec.model_validate({
        "name": name, "priority": priority, "preemptible": preemptible,
        "tasks": [{"id": f"{name}{i}", "run": {"kind": "synthetic", "seconds": TASK_S}}
                  for i in range(n)],
    })  # fmt: skip


async def _first_start_of_high(nats_url: str, tmp: Path, preemptible: bool) -> float:
    """Runs the three pipelines; checks each agent ran them in booked order; returns when the
    high pipeline's first task started, seconds after it was submitted."""
    tmp.mkdir()
    x = "p" if preemptible else "n"  # pipeline ids of this run
    low, high, p5 = f"low-{x}", f"high-{x}", f"p5-{x}"
    orch = Orchestrator(nats_url)
    await orch.start()
    nc = await nats.connect(nats_url)
    loop = asyncio.get_running_loop()
    seen: list[tuple[float, TaskEvent]] = []

    async def on_event(msg: Any) -> None:
        seen.append((loop.time(), decode(msg.data, TaskEvent)))

    for pid in (low, high, p5):
        await nc.subscribe(subjects.task_events_of(pid), cb=on_event)
    await settle(nc)
    try:
        async with AgentProcesses(nats_url, tmp) as fleet:
            for name in ("a1", "a2"):
                await fleet.start(f"{name}-{x}")
            assert await orch.wait_for_agents(2, timeout=30.0) == 2
            await orch.submit_spec(_pipeline("low", 6, 10, preemptible), low)
            await orch.wait_for(
                lambda: any(e.state == "started" for _, e in seen), 10.0
            )  # the low pipeline runs
            at = loop.time()
            await orch.submit_spec(_pipeline("high", 2, 500, False), high)
            await orch.submit_spec(_pipeline("p5", 1, 5, False), p5)
            for pid in (low, high, p5):
                run = await orch.wait_terminal(pid, 30.0)
                assert run.state == "succeeded", run.reason
        ran: dict[str, list[tuple[float, str, str]]] = {}  # agent -> (start, pipeline, task)
        for t, e in seen:
            if e.state == "started":
                ran.setdefault(e.agent_id, []).append((t, e.pipeline_id, e.task_id))
        for agent, starts in ran.items():
            order = [pid for _, pid, _ in sorted(starts)]
            # no task of a later-booked pipeline starts before one booked earlier: the low
            # pipeline's, then high, then p5 (when the high one takes low windows, the low
            # tasks it displaced are booked again after it, and maybe after p5)
            if not preemptible:
                assert order == sorted(order, key=[low, high, p5].index), (agent, order)
        return min(t for t, e in seen if e.pipeline_id == high and e.state == "started") - at
    finally:
        await nc.close()
        await orch.stop()


async def test_agents_run_tasks_in_booked_order_and_preemption_gains(
    nats_url: str, tmp_path: Path
) -> None:
    held = await _first_start_of_high(nats_url, tmp_path / "held", preemptible=False)
    # booked after the low pipeline's three windows per agent: after them, minus the run
    # of the first one already under way when it came
    assert held > 1.5 * TASK_S, held
    pre = await _first_start_of_high(nats_url, tmp_path / "pre", preemptible=True)
    assert pre < held - 0.5 * TASK_S, (pre, held)  # the later low windows were its to take
    print(f"high's first start: {held:.2f} s booked behind low, {pre:.2f} s with preemption")
