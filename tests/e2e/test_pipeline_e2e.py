"""A multi-task pipeline across three real agents over a real nats-server."""

from __future__ import annotations

import pytest

from schemas import PipelineSpec
from tests.harness import agent_config, start_cluster, stop_cluster
from transport.client import Client

pytestmark = pytest.mark.e2e

WAN = {"latency_ms": 100.0, "bandwidth_mbps": 25.0}
CONFIGS = {
    "edge-cpu": agent_config("edge-a", "edge", cpu_slots=2, links=[{"to_site": "cloud", **WAN}]),
    "edge-gpu": agent_config(
        "edge-a", "edge", probe_cpu=False,
        devices=[{"device_id": "gpu0", "kind": "gpu", "gflops": 50.0, "emulated": True,
                  "memory_mb": 2048.0}],
        links=[{"to_site": "cloud", **WAN}]),
    "cloud-cpu": agent_config("cloud", "cloud", cpu_slots=4, links=[{"to_site": "edge-a", **WAN}]),
}  # fmt: skip


def _spec() -> PipelineSpec:
    def syn(seconds: float, out: int = 1000) -> dict[str, object]:
        return {"kind": "synthetic", "mode": "sleep", "seconds": seconds, "output_bytes": out}

    tasks: list[dict[str, object]] = [
        {"id": "src", "run": syn(0.02), "requires": {"tiers": ["edge"]}},
        {"id": "a1", "run": syn(0.05), "deps": ["src"]},
        {"id": "a2", "run": syn(0.05), "deps": ["src"]},
        {"id": "a3", "run": syn(0.05), "deps": ["src"]},
        {"id": "infer", "run": {"kind": "onnx", "model": "tiny_cnn", "batch": 4,
                                          "random_inputs": True},
         "requires": {"kinds": ["gpu"]}, "deps": ["a1", "a2"]},
        {"id": "join", "run": syn(0.01), "deps": ["infer", "a3"]},
        {"id": "sink", "run": syn(0.01, 0), "requires": {"tiers": ["cloud"]}, "deps": ["join"]},
    ]  # fmt: skip
    return PipelineSpec.model_validate({"name": "e2e", "tasks": tasks})


async def test_pipeline_runs_each_task_once_in_order_on_eligible_devices(nats_url: str) -> None:
    orch, agents = await start_cluster(nats_url, CONFIGS)
    client = await Client.connect(nats_url)
    try:
        spec = _spec()
        reply = await client.submit(spec, pipeline_id="e2e-1")
        assert reply.state == "running"
        st = await client.wait(reply.pipeline_id, timeout=20)
        assert st.state == "succeeded", st.reason
        # every task ran exactly once
        runs = [(aid.agent_id, rec) for aid in agents for rec in aid.log]
        ran = sorted(rec[1] for _, rec in runs)
        assert ran == sorted(t.id for t in spec.tasks)
        where = {rec[1]: (aid, rec[2]) for aid, rec in runs}
        # on an eligible device
        assert where["src"][0] in ("edge-cpu", "edge-gpu")
        assert where["infer"] == ("edge-gpu", "gpu0")
        assert where["sink"][0] == "cloud-cpu"
        # in dependency order (one host, one monotonic clock)
        times = {rec[1]: (rec[3], rec[4]) for _, rec in runs}
        for t in spec.tasks:
            for d in t.deps:
                assert times[t.id][0] >= times[d][1], f"{t.id} started before {d} finished"
        # the orchestrator's view agrees with what the agents did
        status = {t.task_id: t for t in st.tasks}
        assert all(s.state == "succeeded" for s in status.values())
        assert {k: (v.agent_id, v.device_id) for k, v in status.items()} == where
        assert status["infer"].result.startswith("top1=")
        # an idempotent resubmit returns the same pipeline, not a second run
        again = await client.submit(spec, pipeline_id="e2e-1")
        assert again.pipeline_id == "e2e-1" and len(orch.pipelines) == 1
    finally:
        await client.close()
        await stop_cluster(orch, agents)


async def test_unschedulable_pipeline_gets_reasons_per_device(nats_url: str) -> None:
    from schemas.codec import RemoteError

    orch, agents = await start_cluster(nats_url, {"only-cpu": CONFIGS["edge-cpu"]})
    client = await Client.connect(nats_url)
    try:
        spec = PipelineSpec.model_validate(
            {
                "name": "needs-npu",
                "tasks": [
                    {"id": "x", "run": {"kind": "synthetic"}, "requires": {"kinds": ["npu"]}}
                ],
            }
        )
        with pytest.raises(RemoteError) as err:
            await client.submit(spec)
        assert err.value.code == "unschedulable"
        assert any(k.startswith("x@only-cpu") for k in err.value.envelope.details)
        assert "npu" in " ".join(err.value.envelope.details.values())
    finally:
        await client.close()
        await stop_cluster(orch, agents)
