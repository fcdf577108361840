"""The operator's failure paths, as `mars` meets them: a dead or drained agent in `mars
agents`."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from orchestrator.client import Client
from tests.harness import agent_config, mars_cli, start_cluster, stop_cluster
from tests.integration.test_recovery import ClusterEvents

pytestmark = pytest.mark.e2e


async def test_mars_agents_shows_a_dead_agent_silent_since_last_heard_and_a_drained_one_draining(
    nats_url: str,
) -> None:
    """A dead agent's last_seen is -inf in the cluster view: `mars agents` failed with
    `error internal: ValidationError ... last_seen_s` during every incident; and a drained
    agent showed as `silent`."""
    cfg = agent_config("s", "edge", cpu_slots=1)
    orch, agents = await start_cluster(nats_url, {"keep": cfg, "victim": cfg})
    events = ClusterEvents()
    await events.start(nats_url)
    client = await Client.connect(nats_url)
    try:
        await agents[1].stop()
        await events.wait("agent_dead", "victim", timeout=10.0)
        rc, out, err = await mars_cli("agents", "--nats", nats_url)
        assert rc == 0, out + err
        lines = {line.split()[0]: line for line in out.splitlines()}
        assert lines["keep"].split()[1] == "alive", out
        victim = lines["victim"]
        assert victim.split()[1] == "silent" and re.search(r" last_seen=\d+\.\ds ago$", victim)

        rc, out, err = await mars_cli("drain", "keep", "--nats", nats_url)
        assert rc == 0 and "agent keep: draining" in out, out + err
        deadline = time.monotonic() + 10.0  # the next heartbeat says it (every 0.2 s)
        while not (await client.agents()).agents[0].draining:
            assert time.monotonic() < deadline, "the orchestrator never heard keep drain"
            await asyncio.sleep(0.05)  # polling the API, with a deadline
        rc, out, err = await mars_cli("agents", "--nats", nats_url)
        assert rc == 0, out + err
        keep = next(line for line in out.splitlines() if line.startswith("keep "))
        assert keep.split()[1] == "draining" and "last_seen" not in keep, out
    finally:
        await client.close()
        await events.stop()
        await stop_cluster(orch, agents[:1])
