"""What `mars agent` and `mars sim agents` do once their agents are up: `run_agent` says so,
and the process then quiets its garbage collector (as the orchestrator does)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys

import psutil
import pytest

from edge_agent.service import run_agent
from orchestrator import eventloop
from orchestrator.cli import _quiet_once_up
from tests.harness import agent_config

pytestmark = pytest.mark.integration


@pytest.mark.usefixtures("gc_state")
async def test_an_agent_process_quiets_its_collector_once_its_agent_is_up(
    nats_url: str,
) -> None:
    gc.set_threshold(700, 10, 10)
    timing = logging.getLogger("mars.timing")
    level = timing.level
    timing.setLevel(logging.DEBUG)  # MARS_DEBUG=mars.timing: pauses logged too
    hooks = len(gc.callbacks)
    started, stop = asyncio.Event(), asyncio.Event()
    quiet = asyncio.create_task(_quiet_once_up(started))
    await asyncio.sleep(0)  # it runs up to its wait for the agent: nothing changed yet
    assert not quiet.done() and gc.get_threshold() == (700, 10, 10)
    cpu = {"device_id": "cpu0", "kind": "cpu", "slots": 1, "gflops": 10.0, "emulated": True}
    cfg = agent_config("s", "edge", probe_cpu=False, devices=[cpu])
    agent = asyncio.create_task(
        run_agent(nats_url, cfg, agent_id="gc-1", stop=stop, grace_s=0, started=started)
    )
    try:
        await asyncio.wait_for(started.wait(), 10.0)  # set once the agent is up
        await asyncio.wait_for(quiet, 5.0)
        assert gc.get_threshold() == eventloop.GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
        assert len(gc.callbacks) == hooks + 1
    finally:
        timing.setLevel(level)
        stop.set()
        await asyncio.wait_for(agent, 10.0)


async def test_a_sim_fleet_process_gives_up_the_cpu_priority_it_is_told(nats_url: str) -> None:
    """`mars sim agents --nice N`: the fleet's process runs N steps nicer than its parent
    (it stands for machines of its own, so on a shared host it yields the cores)."""
    base = os.nice(0)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "orchestrator.cli", "sim", "agents", "--nats", nats_url,
        "--count", "1", "--prefix", "nice", "--nice", "7",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = await asyncio.wait_for(proc.stderr.readline(), 30.0)  # up: it says so
        assert b"sim fleet: 1 agents" in line, line
        assert psutil.Process(proc.pid).nice() == min(19, base + 7)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10.0)


@pytest.mark.parametrize("nice", ["-1", "20"])
async def test_a_sim_fleet_refuses_a_nice_outside_0_to_19(nats_url: str, nice: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "orchestrator.cli", "sim", "agents", "--nats", nats_url,
        "--count", "1", "--nice", nice,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 30.0)
    assert proc.returncode == 2 and b"--nice must be in [0, 19]" in err
