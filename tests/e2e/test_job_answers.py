"""An agent process answers about a job it finished, short ones too: `ended` (its end event
sent again unless its journal knows it was delivered), never `gone`, which placed a finished
task again."""

from __future__ import annotations

from pathlib import Path

import nats
import pytest

from orchestrator.service import Orchestrator
from schemas import PipelineSpec, subjects
from schemas.placement import JobQuery, JobReply
from tests.harness import AgentProcesses
from transport.rpc import request

pytestmark = pytest.mark.e2e


async def test_a_short_finished_job_is_reported_ended_with_its_end_sent_again(
    nats_url: str, tmp_path: Path
) -> None:
    orch = Orchestrator(nats_url)
    await orch.start()
    nc = await nats.connect(nats_url)
    try:
        async with AgentProcesses(nats_url, tmp_path) as fleet:
            await fleet.start("quick", started_event_after_s=0.5)  # its end: its only event
            assert await orch.wait_for_agents(1, timeout=30.0) == 1
            spec = PipelineSpec.model_validate({"name": "short", "tasks": [
                {"id": "t", "run": {"kind": "synthetic", "seconds": 0.001}}]})  # fmt: skip
            await orch.submit_spec(spec, "short")
            run = await orch.wait_terminal("short", 15.0)
            assert run.state == "succeeded", run.reason
            t = run.tasks["t"]
            q = JobQuery(pipeline_id="short", task_id="t", device_id="cpu0", token=t.token)
            rep = await request(nc, subjects.job("quick"), q, JobReply, timeout=5.0)
            assert rep.state == "ended"
            assert run.recoveries == 0
            other = q.model_copy(update={"token": t.token + 1})  # no such run
            assert (await request(nc, subjects.job("quick"), other, JobReply)).state == "gone"
    finally:
        await nc.close()
        await orch.stop()
