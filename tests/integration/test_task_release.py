"""A task that ended gives its reservation back while its pipeline runs on (a window whose end
has passed counts as work still queued or running, so it held its device until the whole
pipeline ended), over a real nats-server."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.reservations.store import device_key
from schemas import PipelineSpec
from schemas.bookings import DeviceBookings
from schemas.codec import decode
from tests.harness import agent_config, start_cluster, stop_cluster

pytestmark = pytest.mark.integration


def configs() -> dict[str, Any]:
    cpu = {"device_id": "cpu0", "kind": "cpu", "gflops": 50.0, "emulated": True}
    return {a: agent_config("s1", "edge", probe_cpu=False, devices=[cpu]) for a in ("x", "y")}


def task(tid: str, agent: str, seconds: float, deps: list[str] | None = None) -> dict[str, Any]:
    return {"id": tid, "requires": {"pinned_agent": agent}, "deps": deps or [],
            "run": {"kind": "synthetic", "seconds": seconds}}  # fmt: skip


async def test_an_ended_task_gives_its_device_back_while_its_pipeline_runs(
    nats_url: str,
) -> None:
    orch, agents = await start_cluster(nats_url, configs())
    kx, ky = device_key("x", "cpu0"), device_key("y", "cpu0")

    def held(key: str, pid: str) -> list[str]:
        cached = orch.store.cache.get(key)
        return [w.task_id for w in cached.book.windows if w.pipeline_id == pid] if cached else []

    try:
        long = PipelineSpec.model_validate({"name": "long", "tasks": [
            task("first", "x", 0.3), task("second", "y", 20.0, deps=["first"]),
        ]})  # fmt: skip
        await orch.submit_spec(long, "p1")
        assert held(kx, "p1") == ["first"] and held(ky, "p1") == ["second"]
        run = orch.pipelines["p1"]
        await orch.wait_for(lambda: run.tasks["first"].state == "succeeded", 10.0)
        await orch.store.wait_until(lambda: not held(kx, "p1"), 10.0)
        assert not run.terminal and held(ky, "p1") == ["second"]  # only what ended went
        entry = await orch.store.kv.get(kx)  # in the bucket, for every replica, not just here
        assert all(w.pipeline_id != "p1" for w in decode(entry.value, DeviceBookings).windows)
        # so a task for x is planned to start now, not after a phantom of `first`
        short = PipelineSpec.model_validate({"name": "short", "tasks": [task("only", "x", 0.3)]})
        reply = await orch.submit_spec(short, "p2")
        [only] = reply.plan
        assert only.start_s < 0.1, only
    finally:
        await stop_cluster(orch, agents)
