"""What `mars agent` and `mars sim agents` do once their agents are up: `run_agent` says so,
and the process then paces its garbage collector (as `mars orchestrator` does)."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from console.cli import _paced_gc_once_up
from edge_agent.service import run_agent
from tests.harness import agent_config

pytestmark = pytest.mark.integration


@pytest.mark.usefixtures("gc_state")
async def test_an_agent_process_paces_its_collector_once_its_agent_is_up(
    nats_url: str,
) -> None:
    timing = logging.getLogger("mars.timing")
    level = timing.level
    timing.setLevel(logging.DEBUG)  # MARS_DEBUG=mars.timing: pauses logged too
    hooks = len(gc.callbacks)
    started, stop = asyncio.Event(), asyncio.Event()
    paced = asyncio.create_task(_paced_gc_once_up(started))
    await asyncio.sleep(0)  # it runs up to its wait for the agent: nothing changed yet
    assert not paced.done() and gc.isenabled() and len(gc.callbacks) == hooks
    cpu = {"device_id": "cpu0", "kind": "cpu", "slots": 1, "gflops": 10.0, "emulated": True}
    cfg = agent_config("s", "edge", probe_cpu=False, devices=[cpu])
    agent = asyncio.create_task(
        run_agent(nats_url, cfg, agent_id="gc-1", stop=stop, grace_s=0, started=started)
    )
    try:
        await asyncio.wait_for(started.wait(), 10.0)  # set once the agent is up
        async with asyncio.timeout(5.0):  # the pacer starts at its next turn or so
            while gc.isenabled():  # noqa: ASYNC110 (no event: the collector's state, polled)
                await asyncio.sleep(0)
        assert gc.get_freeze_count() > 0
        assert len(gc.callbacks) == hooks + 1
        paced.cancel()  # the process stops: the collector is handed back, unlogged
        with pytest.raises(asyncio.CancelledError):
            await paced
        assert gc.isenabled() and len(gc.callbacks) == hooks
    finally:
        paced.cancel()
        timing.setLevel(level)
        stop.set()
        await asyncio.wait_for(agent, 10.0)
