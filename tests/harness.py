"""Run real MARS services (orchestrator, agents) in-process against a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import yaml

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
        #: What each task made here: (pipeline, task) -> output bytes.
        self.made: dict[tuple[str, str], bytes] = {}

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
        self.made[(job.offer.pipeline_id, job.offer.task.id)] = out.data
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
        sys.executable, "-m", "console.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def agent_process_config(
    tmp: Path,
    name: str,
    *,
    gflops: float = 10.0,
    labels: dict[str, str] | None = None,
    started_event_after_s: float = 0.0,
    tier: str = "edge",
    **settings: Any,
) -> Path:
    """An agent config file: one emulated 1-slot CPU, synthetic tasks, 0.2 s heartbeats, every
    started task reported at once (by default), nothing measured that would change its
    figures. `settings`: any other agent settings (`allowed_kinds`, `python_allow`,
    `exec_allow`, ...), over these."""
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "site": f"site-{name}",
                "tier": tier,
                "labels": labels or {},
                "probe_cpu": False,
                "probe_gpus": False,
                "probe_accelerators": False,
                "devices": [{"device_id": "cpu0", "kind": "cpu", "slots": 1, "gflops": gflops,
                             "emulated": True}],
                "allowed_kinds": ["synthetic"],
                "heartbeat_interval_s": 0.2,
                "started_event_after_s": started_event_after_s,
                "link_probe_every_s": 0,
                "recalibrate_every_s": 0,
                "buffer_dir": str(tmp / f"{name}-buffer"),
                **settings,
            }
        )
    )  # fmt: skip
    return cfg


class AgentProcesses:
    """`mars agent` processes (`start`); every one still running is killed at the end (a
    stopped one is continued first)."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.procs: dict[str, asyncio.subprocess.Process] = {}

    async def start(self, name: str, **config: Any) -> asyncio.subprocess.Process:
        cfg = agent_process_config(self.tmp, name, **config)
        self.procs[name] = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "console.cli", "agent", "--nats", self.url,
            "--config", str(cfg), "--id", name, "--grace", "0",
        )  # fmt: skip
        return self.procs[name]

    async def __aenter__(self) -> AgentProcesses:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for p in self.procs.values():
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                await p.wait()
