"""`mars agent` on SIGTERM: stops taking work, lets the running task finish, then exits 0."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml

from orchestrator.service import Orchestrator
from schemas import Heartbeat, PipelineSpec, subjects
from schemas.codec import decode
from transport.rpc import settle

pytestmark = pytest.mark.e2e


async def test_sigterm_drains_and_finishes_running_work(nats_url: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "cpu_slots": 1,
                "heartbeat_interval_s": 0.2,
                "allowed_kinds": ["exec"],
                "exec_allow": [{"path": "cat", "args": ["/.*"], "max_args": 1}],
            }
        )
    )
    orch = Orchestrator(nats_url)
    await orch.start()
    nc = await nats.connect(nats_url)
    draining = asyncio.Event()

    async def on_hb(msg: Any) -> None:
        if decode(msg.data, Heartbeat).draining:
            draining.set()

    await nc.subscribe(subjects.heartbeat("term"), cb=on_hb)
    await settle(nc)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "console.cli", "agent", "--nats", nats_url,
        "--config", str(cfg), "--id", "term", "--grace", "30",
    )  # fmt: skip
    try:
        assert await orch.wait_for_agents(1, timeout=30.0) == 1
        spec = PipelineSpec.model_validate(
            {
                "name": "term",
                "tasks": [{"id": "t", "run": {"kind": "exec", "argv": ["cat", str(gate)]}}],
            }
        )
        pid = (await orch.submit_spec(spec, pipeline_id="term")).pipeline_id
        writer = await asyncio.to_thread(open, gate, "w")  # `cat` is running
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(draining.wait(), 10.0)  # it heard the signal, and is draining
        assert proc.returncode is None
        with writer:
            writer.write("ok")
        assert await asyncio.wait_for(proc.wait(), 10.0) == 0
        run = await orch.wait_terminal(pid, 5.0)
        assert run.state == "succeeded", run.reason
        assert run.tasks["t"].result == "exit 0, 2 B"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await nc.close()
        await orch.stop()
