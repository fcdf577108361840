"""What `mars agent` and `mars sim agents` do once their agents are up: `run_agent` says so,
and the process then quiets its garbage collector (as the orchestrator does)."""

from __future__ import annotations

import asyncio
import gc
import logging

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
