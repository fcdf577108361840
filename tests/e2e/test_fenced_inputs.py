"""A consumer only ever runs on its producer's committed output, with real agent processes.

A producer's agent is silenced (SIGSTOP) while the producer runs; the producer is placed again
elsewhere; the agent is resumed and its old run ends and pushes its output at once. The
consumer, which stayed where it was, must not take that output: its result derives from the
new run only.
"""

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

#: The producer's run time on the first producer agent; the second one is four times slower,
#: so its run is still under way when the first agent, resumed, ends its own run.
PRODUCE_S = 1.5


async def test_a_consumer_never_takes_the_output_of_a_superseded_producer_run(
    nats_url: str, tmp_path: Path
) -> None:
    orch = Orchestrator(nats_url)
    await orch.start()
    nc = await nats.connect(nats_url)
    events: list[TaskEvent] = []
    started: dict[tuple[str, str], asyncio.Event] = {}

    async def on_event(msg: Any) -> None:
        ev = decode(msg.data, TaskEvent)
        events.append(ev)
        started.setdefault((ev.task_id, ev.agent_id), asyncio.Event())
        if ev.state == "started":
            started[(ev.task_id, ev.agent_id)].set()

    await nc.subscribe(subjects.task_events_of("fence"), cb=on_event)
    await settle(nc)
    try:
        async with AgentProcesses(nats_url, tmp_path) as fleet:
            first = await fleet.start("prod-1", labels={"role": "producer"})
            await fleet.start("cons", labels={"role": "consumer"})
            assert await orch.wait_for_agents(2, timeout=30.0) == 2
            spec = PipelineSpec.model_validate({
                "name": "fence",
                "tasks": [
                    {"id": "p", "run": {"kind": "synthetic", "seconds": PRODUCE_S,
                                        "ref_gflops": 10.0},
                     "output_bytes": 100, "requires": {"labels": {"role": "producer"}}},
                    {"id": "c", "deps": ["p"], "run": {"kind": "synthetic", "seconds": 0.05},
                     "requires": {"labels": {"role": "consumer"}}},
                ],
            })  # fmt: skip
            await orch.submit_spec(spec, pipeline_id="fence")
            await asyncio.wait_for(
                started.setdefault(("p", "prod-1"), asyncio.Event()).wait(), 10.0
            )
            first.send_signal(signal.SIGSTOP)  # silenced while p runs there
            stopped = asyncio.get_running_loop().time()
            await fleet.start("prod-2", gflops=2.5, labels={"role": "producer"})
            # p placed again on prod-2 once prod-1 is found dead
            await asyncio.wait_for(
                started.setdefault(("p", "prod-2"), asyncio.Event()).wait(), 30.0
            )
            # resumed once its run of p is due to end: the run ends at once, before anything
            # the orchestrator sends it is read, and pushes its output to c
            # (a fault's timing, not a wait for an event: the stop must outlast the run)
            due = stopped + PRODUCE_S + 0.2 - asyncio.get_running_loop().time()
            await asyncio.sleep(max(0.0, due))
            first.send_signal(signal.SIGCONT)
            run = await orch.wait_terminal("fence", 30.0)
            assert run.state == "succeeded", run.reason
            p, c = run.tasks["p"], run.tasks["c"]
            assert p.agent_id == "prod-2"
            ends = [e for e in events if e.state == "succeeded"]
            old = [e for e in ends if e.task_id == "p" and e.agent_id == "prod-1"]
            new = [e for e in ends if e.task_id == "p" and e.agent_id == "prod-2"]
            assert old, "the resumed agent's run of p ended (the case under test)"
            assert new and new[0].token == p.token != old[0].token
            # every run of c took its input from p's committed run, never the old one
            runs_of_c = [e for e in ends if e.task_id == "c"]
            assert runs_of_c and all(e.input_tokens == {"p": p.token} for e in runs_of_c), [
                e.input_tokens for e in runs_of_c
            ]
            assert c.token == runs_of_c[-1].token
    finally:
        await nc.close()
        await orch.stop()
