"""Run real MARS services (orchestrator, agents) in-process against a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from edge_agent.config import AgentConfig
from edge_agent.core import Job
from edge_agent.executors import Output
from edge_agent.service import Agent
from orchestrator.service import Orchestrator
from schemas.placement import CommitCommand

T = TypeVar("T")


class RecordingAgent(Agent):
    """A real agent that also notes when each task ran (one host, one clock: comparable)."""

    log: list[tuple[str, str, str, float, float]]  # (pipeline, task, device, start, end)

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.log = []

    def forget_first_commit(self) -> list[list[str]]:
        """The first commit this agent is sent is lost on its way: taken, never acted on.
        Returns the list its task ids are noted in."""
        real = self.core.commit
        dropped: list[list[str]] = []

        def forgetful(cmd: CommitCommand) -> int:
            if not dropped:
                dropped.append(list(cmd.task_ids))
                return 0
            return real(cmd)

        self.core.commit = forgetful  # type: ignore[method-assign]
        return dropped

    async def _run(self, job: Job) -> Output:
        t0 = time.monotonic()
        out = await super()._run(job)
        self.log.append(
            (job.offer.pipeline_id, job.offer.task.id, job.offer.device_id, t0, time.monotonic())
        )
        return out


def agent_config(site: str, tier: str, **kw: Any) -> AgentConfig:
    return AgentConfig.model_validate(
        {
            "site": site,
            "tier": tier,
            "heartbeat_interval_s": 0.2,
            # declared links shape the placements tests expect: measured loopback links must
            # not replace them, and a drift check must not change speeds mid-test
            "link_probe_every_s": 0,
            "recalibrate_every_s": 0,
            **kw,
        }
    )


async def start_cluster(
    url: str, configs: dict[str, AgentConfig], **orchestrator: Any
) -> tuple[Orchestrator, list[RecordingAgent]]:
    orch = Orchestrator(url, **orchestrator)
    await orch.start()
    agents = [
        RecordingAgent(url, cfg, agent_id=aid, calibrate=False) for aid, cfg in configs.items()
    ]
    for a in agents:
        await a.start()
    n = await orch.wait_for_agents(len(agents), timeout=10.0)
    assert n == len(agents), f"only {n} agents joined"
    return orch, agents


async def stop_cluster(orch: Orchestrator, agents: list[RecordingAgent]) -> None:
    for a in agents:
        await a.stop()
    await orch.stop()


@contextlib.asynccontextmanager
async def two_replicas(
    url: str, configs: dict[str, AgentConfig], first: str, second: str
) -> AsyncIterator[tuple[Orchestrator, Orchestrator, list[RecordingAgent]]]:
    """A cluster (replica `first` and the agents) and a second replica, all stopped after."""
    one, agents = await start_cluster(url, configs, name=first)
    other = Orchestrator(url, name=second)
    try:
        await other.start()
        yield one, other, agents
    finally:
        with contextlib.suppress(Exception):
            await other.stop()
        await stop_cluster(one, agents)


class LoopThread:
    """An asyncio loop in a thread, so sync (hypothesis) tests can drive async services."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


#: One emulated CPU device (declared, never measured).
EMULATED_CPU = {"device_id": "cpu0", "kind": "cpu", "gflops": 100.0, "emulated": True}


async def one_device_agent(url: str, agent_id: str = "a1") -> RecordingAgent:
    """A started agent with one emulated CPU, no CPU probe and no calibration."""
    agent = RecordingAgent(
        url, agent_config("s1", "edge", probe_cpu=False, devices=[EMULATED_CPU]),
        agent_id=agent_id, calibrate=False,
    )  # fmt: skip
    await agent.start()
    return agent


async def mars_cli(*args: str) -> tuple[int, str, str]:
    """`mars ARGS` as a process of its own: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "orchestrator.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
