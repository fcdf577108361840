"""Offline autonomy over a real nats-server: an agent cut off from NATS keeps running its tasks,
journals their events on disk and delivers them exactly once when it is back (also after a
restart). The agent reaches NATS through a TCP proxy the test can cut and reopen."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import nats
import pytest

from edge_agent.core import Job
from edge_agent.executors import Output
from edge_agent.journal import Journal
from edge_agent.service import Agent
from orchestrator.infra.natsserver import free_port
from orchestrator.service import Orchestrator
from schemas import subjects
from schemas.codec import decode
from schemas.events import TaskEvent, TaskEventState
from schemas.pipeline import PipelineSpec
from tests.harness import agent_config

pytestmark = pytest.mark.integration


class Proxy:
    """A TCP forwarder on 127.0.0.1 that can drop every connection and refuse new ones."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.pumps: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def open(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def cut(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for w in list(self.writers):
            w.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        await self.cut()
        for t in list(self.pumps):
            t.cancel()
        for t in list(self.pumps):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers |= {writer, up_w}
        for src, dst in ((reader, up_w), (up_r, writer)):
            task = asyncio.create_task(self._pump(src, dst))
            self.pumps.add(task)
            task.add_done_callback(self.pumps.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.transport.abort()
            self.writers.discard(dst)


class GatedAgent(Agent):
    """A real agent whose task `t1` waits for the test's go, and which says when an event of a
    task has been handed to its outbox."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.emitted: dict[tuple[str, str], asyncio.Event] = {}

    def emitted_event(self, task: str, state: str) -> asyncio.Event:
        return self.emitted.setdefault((task, state), asyncio.Event())

    async def _run(self, job: Job) -> Output:
        if job.offer.task.id == "t1":
            self.entered.set()
            await self.gate.wait()
        return await super()._run(job)

    def _emit(self, job: Job, state: TaskEventState, **kw: Any) -> None:
        super()._emit(job, state, **kw)
        self.emitted_event(job.offer.task.id, state).set()


def _spec() -> PipelineSpec:
    syn = {"kind": "synthetic", "mode": "sleep", "seconds": 0.01, "output_bytes": 64}
    return PipelineSpec.model_validate(
        {
            "name": "offline",
            "tasks": [
                {"id": "t1", "run": syn},
                {"id": "t2", "run": syn, "deps": ["t1"]},
            ],
        }
    )


async def _final_events(url: str, pipeline_id: str) -> dict[tuple[str, str], int]:
    """How often each (task, state) is stored in the MARS_EVENTS stream."""
    nc = await nats.connect(url)
    counts: dict[tuple[str, str], int] = {}
    try:
        js = nc.jetstream()
        sub = await js.subscribe(subjects.task_events_of(pipeline_id), ordered_consumer=True)
        while True:
            msg = await sub.next_msg(timeout=5)
            ev = decode(msg.data, TaskEvent)
            counts[(ev.task_id, ev.state)] = counts.get((ev.task_id, ev.state), 0) + 1
            if msg.metadata.num_pending == 0:
                break
        await sub.unsubscribe()
    finally:
        await nc.close()
    return counts


def _config(buffer_dir: Path) -> Any:
    return agent_config(
        "s",
        "edge",
        cpu_slots=1,
        buffer_dir=str(buffer_dir),
        reconnect_base_s=0.05,
        reconnect_max_s=0.2,
        started_event_after_s=0,  # each start reported at once: the test follows both events
    )


async def _cut_while_t1_finishes(orch: Orchestrator, agent: GatedAgent, proxy: Proxy) -> str:
    """Submit, cut the agent off while t1 runs, let both tasks finish offline."""
    await orch.submit_spec(_spec(), pipeline_id="off-1")
    async with asyncio.timeout(10):
        await agent.entered.wait()
        await agent.emitted_event("t1", "started").wait()
        await agent.outbox.wait_empty(5.0)  # "started" reached the server before the cut
    await proxy.cut()
    async with asyncio.timeout(10):
        await agent.offline.wait()
    agent.gate.set()  # t1 finishes while the agent is cut off; t2 runs after it, locally
    async with asyncio.timeout(10):
        await agent.emitted_event("t2", "succeeded").wait()
    run = orch.pipelines["off-1"]
    assert run.state == "running" and run.tasks["t1"].state != "succeeded"
    pending = [decode(e.data, TaskEvent) for e in agent.outbox.journal.pending()]
    assert [(e.task_id, e.state) for e in pending] == [
        ("t1", "succeeded"),
        ("t2", "started"),
        ("t2", "succeeded"),
    ]
    assert agent.outbox.journal.path.stat().st_size > 0  # on disk, not only in memory
    return "off-1"


async def test_cut_off_agent_delivers_buffered_results_exactly_once(
    nats_url: str, nats_server: Any, tmp_path: Path
) -> None:
    proxy = Proxy(nats_server.port)
    await proxy.open()
    orch = Orchestrator(nats_url)
    await orch.start()
    agent = GatedAgent(proxy.url, _config(tmp_path / "buf"), agent_id="edge-1", calibrate=False)
    await agent.start()
    try:
        assert await orch.wait_for_agents(1, 10.0) == 1
        pid = await _cut_while_t1_finishes(orch, agent, proxy)
        await proxy.open()  # back online: the journal is replayed in order
        run = await orch.wait_terminal(pid, 20.0)
        assert run.state == "succeeded", run.reason
        assert await agent.outbox.wait_empty(5.0)
        assert agent.outbox.journal.pending() == []
        counts = await _final_events(nats_url, pid)
        assert counts[("t1", "succeeded")] == 1 and counts[("t2", "succeeded")] == 1
        assert counts[("t1", "started")] == 1 and counts[("t2", "started")] == 1
        assert run.duplicate_events == 0 and run.stale_events == 0
    finally:
        await agent.stop()
        await orch.stop()
        await proxy.close()
    again = Journal(agent.outbox.journal.path)  # what a restart would replay: nothing
    try:
        assert again.pending() == [] and again.skipped == 0
    finally:
        again.close()


async def test_a_journal_left_by_a_stopped_agent_is_replayed_by_the_next_start(
    nats_url: str, nats_server: Any, tmp_path: Path
) -> None:
    proxy = Proxy(nats_server.port)
    await proxy.open()
    orch = Orchestrator(nats_url)
    await orch.start()
    agent = GatedAgent(proxy.url, _config(tmp_path / "buf"), agent_id="edge-1", calibrate=False)
    await agent.start()
    again: Agent | None = None
    try:
        assert await orch.wait_for_agents(1, 10.0) == 1
        pid = await _cut_while_t1_finishes(orch, agent, proxy)
        await agent.stop()  # the process ends while still cut off
        assert agent.outbox.journal.path.stat().st_size > 0
        # the next start (a new incarnation, same id and buffer dir) replays the old events:
        # their tokens still hold, so the orchestrator takes them
        again = Agent(nats_url, _config(tmp_path / "buf"), agent_id="edge-1", calibrate=False)
        assert len(again.outbox.journal) == 3
        await again.start()
        run = await orch.wait_terminal(pid, 20.0)
        assert run.state == "succeeded", run.reason
        assert await again.outbox.wait_empty(5.0)
        counts = await _final_events(nats_url, pid)
        assert counts[("t1", "succeeded")] == 1 and counts[("t2", "succeeded")] == 1
    finally:
        if again is not None:
            await again.stop()
        await orch.stop()
        await proxy.close()
