"""The secure multi-site deployment `mars deploy` generates, run whole on loopback: a 3-node
hub cluster, two leaf sites, TLS and an nkey per identity, an orchestrator replica per hub
node, agents at both sites and in the cloud."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from schemas import subjects
from schemas.codec import decode
from schemas.events import PipelineEvent
from schemas.pipeline import PipelineSpec
from tests.topology import Topology
from transport.client import Client

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SITES = {"a": ["a1", "a2"], "b": ["b1"]}
CLOUD = ["c1"]


@pytest_asyncio.fixture
async def topo(tmp_path: Path) -> AsyncIterator[Topology]:
    t = Topology(tmp_path, SITES, CLOUD, proxied=("a",))
    try:
        await t.start_servers()
        for h in t.hub_names:
            await t.start_replica(h)
        for a in [*SITES["a"], *SITES["b"], *CLOUD]:
            await t.start_agent(a)
        yield t
    finally:
        await t.close()


def spanning(name: str, *, seconds: float = 0.05, big: int = 0) -> PipelineSpec:
    """Site A -> site A (a large output when `big`), site B, both -> the cloud."""
    return PipelineSpec.model_validate(
        {"name": name, "tasks": [
            {"id": "sense", "run": {"kind": "synthetic", "seconds": seconds,
                                    "output_bytes": big or 1000},
             "requires": {"pinned_agent": "a1"}},
            {"id": "filter", "deps": ["sense"],
             "run": {"kind": "synthetic", "seconds": seconds, "output_bytes": 500},
             "requires": {"pinned_agent": "a2"}},
            {"id": "other", "run": {"kind": "synthetic", "seconds": seconds,
                                    "output_bytes": 700},
             "requires": {"pinned_agent": "b1"}},
            {"id": "merge", "deps": ["filter", "other"],
             "run": {"kind": "synthetic", "seconds": seconds},
             "requires": {"pinned_agent": "c1"}},
        ]}
    )  # fmt: skip


async def client_as(t: Topology, kind: str, name: str) -> Client:
    """An API client with `name`'s identity: a user on its own subjects, an admin on all."""
    nc = await t.connect("user", name)
    return Client(nc, timeout=20.0, user=name if kind == "user" else None)


async def wait_agents(c: Client, n: int) -> None:
    alive = await c.wait_for_agents(n, 60)
    assert alive >= n, f"only {alive} of {n} agents joined"


def done(st: Any) -> None:
    assert st.state == "succeeded", (st.state, st.reason, st.placement_log[-5:])
    assert all(t.state == "succeeded" for t in st.tasks)
    assert st.results_committed == len(st.tasks)


async def test_pipeline_spans_sites_and_cloud(topo: Topology) -> None:
    alice = await client_as(topo, "user", "alice")
    try:
        await wait_agents(alice, 4)
        ended = asyncio.Event()

        async def on_event(msg: Any) -> None:
            if decode(msg.data, PipelineEvent).state == "succeeded":
                ended.set()

        # her pipeline's events reach her on her own subject (not every pipeline's)
        await alice.nc.subscribe(subjects.user_pipeline_event("alice", "spans-1"), cb=on_event)
        rep = await alice.submit(spanning("spans"), pipeline_id="spans-1")
        await asyncio.wait_for(ended.wait(), 60)
        st = await alice.status(rep.pipeline_id)
        done(st)
        # every stream MARS made is on all three hub nodes
        nc = await topo.connect("replica", "h1")
        names = await topo.js(nc).streams_info()
        await nc.close()
        replicas = {i.config.name: i.config.num_replicas for i in names}
        for stream in ("MARS_EVENTS", "KV_MARS_BOOKINGS", "KV_MARS_RUNS", "KV_MARS_OWNERS",
                       "KV_MARS_RESULTS", "OBJ_MARS_OUTPUTS", "OBJ_MARS_DATA"):  # fmt: skip
            assert replicas.get(stream) == 3, (stream, replicas)
        where = {p.task_id: p.agent_id for p in st.plan}
        assert where == {"sense": "a1", "filter": "a2", "other": "b1", "merge": "c1"}
    finally:
        await alice.close()


async def test_hub_node_killed_mid_pipeline(topo: Topology) -> None:
    ops = await client_as(topo, "admin", "ops")
    try:
        await wait_agents(ops, 4)
        rep = await ops.submit(spanning("hubloss", seconds=1.5))
        topo.servers["h2"].kill()
        st = await ops.wait(rep.pipeline_id, 90)
        done(st)
        assert st.duplicate_events >= 0 and st.results_dropped == 0
    finally:
        await ops.close()


async def test_site_uplink_cut_keeps_site_running(topo: Topology) -> None:
    """Site A cut from the hub while its tasks run: they keep running, and their events
    arrive once the uplink is back; every result is committed exactly once."""
    ops = await client_as(topo, "admin", "ops")
    try:
        await wait_agents(ops, 4)
        rep = await ops.submit(spanning("uplink", seconds=1.0))
        started = asyncio.Event()

        async def on_event(msg: Any) -> None:
            if ".sense." in msg.subject:
                started.set()

        watch = await topo.connect("replica", "h1")
        await watch.subscribe(f"mars.v1.events.task.{rep.pipeline_id}.>", cb=on_event)
        await asyncio.wait_for(started.wait(), 30)
        for px in topo.uplinks["a"]:
            px.cut()
        await asyncio.sleep(2.5)  # the outage itself: site A alone for longer than its tasks
        for px in topo.uplinks["a"]:
            px.restore()
        st = await ops.wait(rep.pipeline_id, 90)
        done(st)
        assert st.recoveries == 0, "site A's work was moved instead of waited for"
        await watch.close()
    finally:
        await ops.close()
