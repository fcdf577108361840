"""Backpressure: while the orchestrator is behind on live task events, a new submission waits
for them to be handled before it is placed (over a real nats-server)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from benchmarks.placement_latency import handler_spans, held_for_events
from orchestrator import service
from schemas import PipelineSpec, subjects
from tests.harness import agent_config, start_cluster, stop_cluster
from transport.client import Client
from transport.rpc import settle

pytestmark = pytest.mark.integration

BACKLOG = 12


class GatedPacer:
    """Stands in for the orchestrator's event pacer: holds the events handler at its first
    event until the test opens the gate, so the events behind it wait."""

    def __init__(self) -> None:
        self.gate, self.holding = asyncio.Event(), asyncio.Event()
        self.turns = 0

    async def pace(self, more: bool) -> None:
        self.holding.set()
        await self.gate.wait()


class WatchedEvent(asyncio.Event):
    """The orchestrator's "events caught up" flag, telling the test when a submission waits
    on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waited = asyncio.Event()

    async def wait(self) -> bool:  # type: ignore[override]
        self.waited.set()
        return await super().wait()


async def test_a_submission_waits_while_task_events_are_behind(
    nats_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(service, "EVENTS_BEHIND", BACKLOG // 2)
    monkeypatch.setattr(service, "EVENTS_CAUGHT_UP", 1)
    orch, agents = await start_cluster(nats_url, {"c1": agent_config("s", "edge")})
    pacer, caught_up = GatedPacer(), WatchedEvent()
    caught_up.set()
    orch.event_pacer = pacer  # type: ignore[assignment]
    orch.events_caught_up = caught_up
    client = await Client.connect(nats_url, timeout=10.0)
    try:
        for i in range(BACKLOG):  # events of a pipeline nobody holds: cheap, but queued
            await client.nc.publish(subjects.task_event("gone", f"t{i}", "c1"), b"{}")
        await settle(client.nc)
        await asyncio.wait_for(pacer.holding.wait(), 5.0)
        # a round trip to the orchestrator behind them: every event is in its queue now
        await client.agents()
        assert orch.events_backlog() >= BACKLOG // 2
        spec = PipelineSpec.model_validate(
            {"name": "p", "tasks": [{"id": "t", "run": {"kind": "synthetic", "seconds": 0}}]}
        )
        caplog.set_level(logging.DEBUG, logger="mars.timing")
        sub = asyncio.create_task(client.submit(spec, pipeline_id="held"))
        await asyncio.wait_for(caught_up.waited.wait(), 5.0)
        waiting_since = time.perf_counter()
        assert not sub.done() and "held" not in orch.pipelines  # not placed yet
        assert orch.held_submissions == 1
        waited_s = time.perf_counter() - waiting_since
        pacer.gate.set()  # the events are handled: the submission goes on
        reply = await asyncio.wait_for(sub, 10.0)
        assert reply.state == "running" and orch.events_backlog() <= 1
        assert (await orch.wait_terminal("held", 10.0)).state == "succeeded"
    finally:
        pacer.gate.set()
        await client.close()
        with caplog.at_level(logging.WARNING, logger="mars.orchestrator"):
            await stop_cluster(orch, agents)
    # said at stop, in the line the placement benchmark reads back
    log = tmp_path / "orchestrator.log"
    log.write_text("\n".join(r.getMessage() for r in caplog.records) + "\n")
    assert held_for_events(log) == 1
    # the placement's timing line: called before the wait, and the wait apart from the rest
    called, held_ms, handler_ms = handler_spans(log)["held"]
    assert called <= waiting_since  # one monotonic clock in the test and the orchestrator
    assert held_ms >= 1e3 * waited_s > 0.0 and handler_ms > 0.0
