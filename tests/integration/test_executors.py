"""exec and python tasks, slots, cancel, drain and graceful shutdown over a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest

from console import cli
from edge_agent.core import Job
from edge_agent.executors import Output
from edge_agent.service import Agent
from orchestrator.service import Orchestrator
from schemas import (
    CancelRequest,
    CommitCommand,
    DrainCommand,
    DrainReply,
    Heartbeat,
    OfferReply,
    PipelineSpec,
    TaskEvent,
    TaskOffer,
    TaskSpec,
    subjects,
)
from schemas.codec import ERROR_HEADER, RemoteError, decode
from schemas.errors import ServiceError
from tests.harness import agent_config
from tests.integration.test_exec_runner import dead, read_fifo
from transport.rpc import request, settle

pytestmark = pytest.mark.integration

AID = "x1"
SLOTS = 2


class CountingAgent(Agent):
    """A real agent that counts tasks inside an executor at once and keeps their outputs."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.active = 0
        self.most = 0
        self.runs = 0
        self.outputs: dict[tuple[str, str], bytes] = {}

    async def _run(self, job: Job) -> Output:
        self.runs += 1
        self.active += 1
        self.most = max(self.most, self.active)
        try:
            out = await super()._run(job)
        finally:
            self.active -= 1
        self.outputs[job.key] = out.data
        return out


def config(**kw: Any) -> Any:
    base: dict[str, Any] = dict(
        cpu_slots=SLOTS,
        allowed_kinds=["synthetic", "exec", "python"],
        exec_allow=[
            {"path": "printf", "prefix": ["%s"], "args": ["[a-z ]*"], "max_args": 4},
            {"path": "yes"},
            {"path": "sleep", "args": [r"\d+(\.\d+)?"], "max_args": 1},
            {"path": "cat", "args": [r"/.*"], "max_args": 1},
            {"path": "sh", "prefix": ["-c"], "args": [r"echo \$\$ > /\S+; exec sleep \d+"]},
        ],
        exec_timeout_s=30.0,
        exec_max_output_bytes=1000,
        python_allow=["edge_agent.builtin_tasks"],
    )
    base.update(kw)
    return agent_config("s1", "edge", **base)


Cluster = tuple[Orchestrator, CountingAgent]


@contextlib.asynccontextmanager
async def running(url: str, **kw: Any) -> AsyncIterator[Cluster]:
    orch = Orchestrator(url)
    await orch.start()
    agent = CountingAgent(url, config(**kw), agent_id=AID, calibrate=False)
    await agent.start()
    try:
        assert await orch.wait_for_agents(1, timeout=10.0) == 1
        yield orch, agent
    finally:
        await agent.stop()
        await orch.stop()


@pytest.fixture
async def cluster(nats_url: str) -> AsyncIterator[Cluster]:
    async with running(nats_url) as c:
        yield c


def pipeline(name: str, *runs: dict[str, Any]) -> PipelineSpec:
    tasks = [TaskSpec.model_validate({"id": f"t{i}", "run": r}) for i, r in enumerate(runs)]
    return PipelineSpec(name=name, tasks=tasks)


async def submit(orch: Orchestrator, name: str, *runs: dict[str, Any]) -> str:
    reply = await orch.submit_spec(pipeline(name, *runs), pipeline_id=name)
    return reply.pipeline_id


def fifo(tmp_path: Path, name: str = "gate") -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


def sleeper(path: Path) -> dict[str, Any]:
    """An exec task that reports its pid through a FIFO, then sleeps for long."""
    return {"kind": "exec", "argv": ["sh", "-c", f"echo $$ > {path}; exec sleep 30"]}


async def test_allowlisted_exec_and_python_outputs(cluster: Cluster) -> None:
    orch, agent = cluster
    pid = await submit(
        orch,
        "ok",
        {"kind": "exec", "argv": ["printf", "%s", "hello world"]},
        {"kind": "python", "entry": "edge_agent.builtin_tasks:checksum", "kwargs": {"text": "ab"}},
        {"kind": "python", "entry": "edge_agent.builtin_tasks:describe", "kwargs": {"n": 2}},
    )
    run = await orch.wait_terminal(pid, 5.0)
    assert run.state == "succeeded", run.reason
    assert agent.outputs[(pid, "t0")] == b"hello world"
    assert run.tasks["t0"].result == "exit 0, 11 B"
    assert agent.outputs[(pid, "t1")] == hashlib.sha256(b"ab").hexdigest().encode()
    assert agent.outputs[(pid, "t2")] == b'{"count":1,"kwargs":{"n":2}}'
    # each finished task is learned against the uncorrected estimate its plan used
    for tr in run.tasks.values():
        key = f"{tr.agent_id}:{tr.device_id}"
        _, dev = orch.view.device_spec(key)
        want = orch.predictor.estimate([run.spec_by_id[tr.task_id]], [dev], [key]).base[0, 0]
        assert tr.base_s == pytest.approx(float(want), rel=1e-6)


async def test_unlisted_command_is_rejected_with_a_reason_and_never_run(
    cluster: Cluster, tmp_path: Path
) -> None:
    orch, agent = cluster
    marker = tmp_path / "pwned"
    attempts = {
        "plain": ["touch", str(marker)],
        "abs": ["/usr/bin/touch", str(marker)],
        "shell": ["sh", "-c", f"touch {marker}"],
        "args": ["printf", "%s", f"$(touch {marker})"],
        "py": None,
    }
    for name, argv in attempts.items():
        run_spec: dict[str, Any] = (
            {"kind": "exec", "argv": argv}
            if argv is not None
            else {"kind": "python", "entry": "os:system", "kwargs": {"command": f"touch {marker}"}}
        )
        with pytest.raises(ServiceError) as info:
            await submit(orch, name, run_spec)
        assert info.value.code == "unschedulable"
        assert any("not_allowlisted" in v for v in info.value.details.values()), info.value.details
        run = orch.pipelines[name]
        assert run.state == "unschedulable"
        assert any("not_allowlisted" in line for line in run.placement_log), run.placement_log
    assert agent.runs == 0 and not agent.core.jobs
    assert not marker.exists()


async def test_output_over_the_limit_and_timeout_fail_clearly(
    cluster: Cluster, tmp_path: Path
) -> None:
    orch, _ = cluster
    t0 = time.monotonic()
    big = await submit(orch, "big", {"kind": "exec", "argv": ["yes"]})  # endless output
    run = await orch.wait_terminal(big, 5.0)
    assert run.state == "failed"
    assert "output exceeded 1000 bytes; process killed" in run.reason
    path = fifo(tmp_path)
    spec = {**sleeper(path), "timeout_s": 0.5}
    slow = await submit(orch, "slow", spec)
    proc = int(await asyncio.to_thread(read_fifo, path))
    run = await orch.wait_terminal(slow, 5.0)
    assert run.state == "failed" and "timed out after 0.5 s" in run.reason, run.reason
    assert dead(proc)
    assert time.monotonic() - t0 < 5.0


async def test_agent_caps_the_task_timeout(nats_url: str) -> None:
    async with running(nats_url, exec_timeout_s=0.5) as (orch, _):
        spec = {"kind": "exec", "argv": ["sleep", "20"], "timeout_s": 60}
        pid = await submit(orch, "capped", spec)
        run = await orch.wait_terminal(pid, 5.0)
    assert run.state == "failed" and "timed out after 0.5 s" in run.reason, run.reason


async def test_concurrency_per_device_never_exceeds_its_slots(cluster: Cluster) -> None:
    """Offers straight to the agent, all on one slot: the agent itself must queue them."""
    _, agent = cluster
    assert agent.nc is not None
    nc = await nats.connect(agent.nats_url)
    runs: list[dict[str, Any]] = [
        {"kind": "synthetic", "seconds": 0.15},
        {"kind": "exec", "argv": ["sleep", "0.15"]},
        {"kind": "python", "entry": "edge_agent.builtin_tasks:pause", "kwargs": {"seconds": 0.15}},
    ]
    n = 9
    done: list[TaskEvent] = []
    all_done = asyncio.Event()

    async def on_event(msg: Any) -> None:
        ev = decode(msg.data, TaskEvent)
        if ev.state in ("succeeded", "failed", "cancelled"):
            done.append(ev)
            if len(done) == n:
                all_done.set()

    try:
        await nc.subscribe(subjects.task_events_of("slots"), cb=on_event)
        for i in range(n):
            offer = TaskOffer(
                pipeline_id="slots", agent_id=AID, incarnation=agent.incarnation,
                device_id="cpu0", slot=0, token=1, order=i,
                task=TaskSpec.model_validate({"id": f"t{i}", "run": runs[i % 3]}),
            )  # fmt: skip
            rep = await request(nc, subjects.offer(AID), offer, OfferReply)
            assert rep.accepted, rep
        cmd = CommitCommand(pipeline_id="slots", task_ids=[f"t{i}" for i in range(n)])
        await request(nc, subjects.commit(AID), cmd, CommitCommand)
        await asyncio.wait_for(all_done.wait(), 5.0)
    finally:
        await nc.close()
    assert all(ev.state == "succeeded" for ev in done), [ev.error for ev in done]
    assert agent.most == SLOTS  # used every slot, never more


async def test_cancel_kills_the_exec_process(cluster: Cluster, tmp_path: Path) -> None:
    orch, agent = cluster
    path = fifo(tmp_path)
    pid = await submit(orch, "cancel-me", sleeper(path))
    proc = int(await asyncio.to_thread(read_fifo, path))
    await orch.queries.cancel(CancelRequest(pipeline_id=pid, reason="test"))
    assert await agent.wait_idle(5.0)
    assert dead(proc)


@contextlib.asynccontextmanager
async def draining_seen(url: str) -> AsyncIterator[tuple[Any, asyncio.Event]]:
    """A connection, and an event set by the first heartbeat of the agent that says draining."""
    nc = await nats.connect(url)
    seen = asyncio.Event()

    async def on_hb(msg: Any) -> None:
        if decode(msg.data, Heartbeat).draining:
            seen.set()

    try:
        await nc.subscribe(subjects.heartbeat(AID), cb=on_hb)
        await settle(nc)
        yield nc, seen
    finally:
        await nc.close()


async def _drain(nc: Any, **kw: Any) -> DrainReply:
    return await request(nc, subjects.drain(AID), DrainCommand(agent_id=AID, **kw), DrainReply)


async def test_drain_rejects_offers_while_running_work_finishes(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    orch, agent = cluster
    gate = fifo(tmp_path)
    pid = await submit(orch, "long", {"kind": "exec", "argv": ["cat", str(gate)]})
    writer = await asyncio.to_thread(open, gate, "w")  # returns once `cat` is running
    async with draining_seen(agent.nats_url) as (nc, seen):
        rep = await _drain(nc)
        assert rep == DrainReply(agent_id=AID, draining=True, running=1, queued=0)
        offer = TaskOffer(
            pipeline_id="late", agent_id=AID, incarnation=agent.incarnation, device_id="cpu0",
            token=1, task=TaskSpec.model_validate({"id": "t", "run": {"kind": "synthetic"}}),
        )  # fmt: skip
        late = await request(nc, subjects.offer(AID), offer, OfferReply)
        assert not late.accepted and late.code == "draining"
        await asyncio.wait_for(seen.wait(), 5.0)
        # the CLI says the same
        rc = await asyncio.to_thread(cli.main, ["drain", AID, "--nats", agent.nats_url])
        assert rc == 0
        assert f"agent {AID}: draining; 1 running, 0 queued" in capsys.readouterr().out
        # the running job is not disturbed: it finishes and succeeds
        with writer:
            writer.write("finished")
        run = await orch.wait_terminal(pid, 5.0)
        assert run.state == "succeeded", run.reason
        assert agent.outputs[(pid, "t0")] == b"finished"
        back = await _drain(nc, resume=True)
        assert not back.draining
        assert (await request(nc, subjects.offer(AID), offer, OfferReply)).accepted
        with pytest.raises(RemoteError, match="drain for agent"):
            await request(nc, subjects.drain(AID), DrainCommand(agent_id="other"), DrainReply)
        garbage = await nc.request(subjects.drain(AID), b"\xc1not msgpack", timeout=2.0)
        assert garbage.headers and garbage.headers.get(ERROR_HEADER)
        assert (await _drain(nc)).draining  # still serving


async def test_graceful_shutdown_finishes_running_work(cluster: Cluster, tmp_path: Path) -> None:
    orch, agent = cluster
    gate = fifo(tmp_path)
    pid = await submit(orch, "finish-me", {"kind": "exec", "argv": ["cat", str(gate)]})
    writer = await asyncio.to_thread(open, gate, "w")
    t0 = time.monotonic()
    async with draining_seen(agent.nats_url) as (_, seen):
        stopping = asyncio.create_task(agent.shutdown(grace_s=30.0))
        await asyncio.wait_for(seen.wait(), 5.0)
    assert not stopping.done()  # waiting for the running job
    with writer:
        writer.write("done")
    await asyncio.wait_for(stopping, 5.0)
    assert time.monotonic() - t0 < 5.0  # ended when the work did, not at the grace
    run = await orch.wait_terminal(pid, 5.0)
    assert run.state == "succeeded", run.reason
    assert agent.nc is None


async def test_shutdown_cancels_what_outlives_the_grace(cluster: Cluster, tmp_path: Path) -> None:
    orch, agent = cluster
    path = fifo(tmp_path)
    pid = await submit(orch, "outlive", sleeper(path))
    proc = int(await asyncio.to_thread(read_fifo, path))
    await agent.shutdown(grace_s=0.3)
    assert dead(proc)
    run = orch.pipelines[pid]
    await orch.wait_for(lambda: run.tasks["t0"].state == "cancelled", 5.0)


async def test_drain_deadline_cancels_what_is_left(cluster: Cluster, tmp_path: Path) -> None:
    orch, agent = cluster
    path = fifo(tmp_path)
    pid = await submit(orch, "left", sleeper(path))
    proc = int(await asyncio.to_thread(read_fifo, path))
    async with draining_seen(agent.nats_url) as (nc, _):
        rep = await _drain(nc, deadline_s=0.3)
    assert rep.draining and rep.running == 1
    run = orch.pipelines[pid]
    await orch.wait_for(lambda: run.tasks["t0"].state == "cancelled", 5.0)
    assert dead(proc)
    assert agent.core.draining and agent.nc is not None  # still up, still draining
