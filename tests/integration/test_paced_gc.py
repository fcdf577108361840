"""`mars orchestrator` paces its garbage collector once it serves (`eventloop.PacedGc`), and
hands it back when it stops (over a real nats-server)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from orchestrator.service import run_orchestrator
from schemas import PipelineSpec
from schemas.codec import RemoteError
from transport.client import Client

pytestmark = pytest.mark.integration


@pytest.mark.usefixtures("gc_state")
async def test_the_orchestrator_process_paces_its_collector_while_it_serves(
    nats_url: str,
) -> None:
    assert gc.isenabled()
    started, stop = asyncio.Event(), asyncio.Event()
    orch = asyncio.create_task(run_orchestrator(nats_url, stop=stop, started=started))
    try:
        await asyncio.wait_for(started.wait(), 15.0)
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        client = await Client.connect(nats_url, timeout=10.0)
        try:  # it serves (no agent is up: nothing can be placed, and it says so)
            spec = PipelineSpec.model_validate(
                {"name": "p", "tasks": [{"id": "t", "run": {"kind": "synthetic", "seconds": 0}}]}
            )
            with pytest.raises(RemoteError) as failed:
                await client.submit(spec)
            assert failed.value.code == "unavailable"
        finally:
            await client.close()
    finally:
        stop.set()
        await asyncio.wait_for(orch, 15.0)
    assert gc.isenabled()
