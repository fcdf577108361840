"""`list` reads the pipelines' records in KV, over a real nats-server: every pipeline kept,
not just the few ended ones a replica holds in memory, in pages and by state, and still
after the replica that ran them restarted."""

from __future__ import annotations

import pytest

from orchestrator.service import MAX_PIPELINES_KEPT, TRIM_STEP, Orchestrator
from schemas import PipelineSpec
from schemas.api import ListReply
from tests.harness import agent_config, mars_cli, start_cluster, stop_cluster
from transport.client import Client

pytestmark = pytest.mark.integration


def one_task(seconds: float) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {"name": "one", "tasks": [{"id": "t", "run": {"kind": "synthetic", "seconds": seconds}}]}
    )


def ids(reply: ListReply) -> list[str]:
    return [p.pipeline_id for p in reply.pipelines]


async def test_every_kept_pipeline_is_listed_in_pages_and_after_a_restart(nats_url: str) -> None:
    """More pipelines than a replica keeps in memory: before, `list` showed the ones it
    kept (about half of 100 recent ones), and none after a restart."""
    orch, agents = await start_cluster(nats_url, {"a": agent_config("s", "edge", cpu_slots=2)})
    client = await Client.connect(nats_url)
    n = MAX_PIPELINES_KEPT + TRIM_STEP + 8
    try:
        for i in range(n):
            await orch.submit_spec(one_task(0.001), f"p{i:03d}")
            await orch.wait_terminal(f"p{i:03d}", 30.0)
        await orch.submit_spec(one_task(60.0), "long")
        await client.cancel("long")
        assert len(orch.pipelines) < n  # the rest are in KV only
        newest = ["long", *(f"p{i:03d}" for i in reversed(range(n)))]

        got = await client.list(limit=1000)
        assert ids(got) == newest and got.total == n + 1 and got.unanswered == []
        assert [p.state for p in got.pipelines] == ["cancelled"] + ["succeeded"] * n
        assert {(p.name, p.tasks, p.owner) for p in got.pipelines} == {("one", 1, orch.owner)}
        page = await client.list(limit=15, offset=30)
        assert ids(page) == newest[30:45] and page.total == n + 1
        assert ids(await client.list(offset=n + 1)) == []
        done = await client.list(state="succeeded", limit=3, offset=1)
        assert ids(done) == newest[2:5] and done.total == n
        assert ids(await client.list(state="cancelled")) == ["long"]

        rc, out, err = await mars_cli("list", "--limit", "5", "--offset", "2", "--nats", nats_url)
        assert rc == 0, err
        assert [line.split()[0] for line in out.splitlines()] == newest[2:7]
        assert err.strip() == f"3-7 of {n + 1}; the next: --offset 7"
        rc, out, err = await mars_cli("list", "--state", "running", "--nats", nats_url)
        assert (rc, out, err) == (0, "", "")

        await orch.stop()  # a new replica: nothing in memory, every record in KV
        orch = Orchestrator(nats_url, name="orch-after")
        await orch.start()
        again = await client.list(limit=1000)
        assert ids(again) == newest and again.total == n + 1
        assert [p.state for p in again.pipelines] == [p.state for p in got.pipelines]
    finally:
        await client.close()
        await stop_cluster(orch, agents)
