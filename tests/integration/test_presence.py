"""Presence over a real nats-server: with sparse (default) heartbeats, a silent link is found by
the server's pings and reported as a disconnect."""

from __future__ import annotations

import time

import pytest

from edge_agent.config import AgentConfig
from schemas.presence import PING_INTERVAL_S, PING_MAX, SILENT_DETECTION_S
from sim.linkemu import LinkProxy
from tests.harness import RecordingAgent, agent_config, start_cluster, stop_cluster
from tests.integration.test_recovery import ClusterEvents

pytestmark = pytest.mark.integration

DEFAULT_HB = AgentConfig().heartbeat_interval_s


async def test_silent_link_is_closed_by_the_servers_pings_and_the_agent_comes_back(
    nats_url: str,
) -> None:
    orch, agents = await start_cluster(nats_url, {})
    events = ClusterEvents()
    await events.start(nats_url)
    host, port = nats_url.rsplit("//", 1)[1].split(":")
    proxy = LinkProxy(host, int(port))
    await proxy.start()
    cfg = agent_config("edge", "edge", heartbeat_interval_s=DEFAULT_HB)
    victim = RecordingAgent(proxy.url, cfg, agent_id="quiet", calibrate=False)
    await victim.start()
    try:
        assert await orch.wait_for_agents(1, timeout=10.0) == 1
        proxy.cut()  # TCP stays open; no byte crosses
        cut = time.monotonic()
        at, ev = await events.wait("agent_dead", "quiet", timeout=3 * SILENT_DETECTION_S + 2.0)
        assert ev.cause == "silent", ev
        # between PING_MAX and PING_MAX + 1 ping intervals of silence (the server's timers
        # and this loop add a little), far sooner than 3 missed default heartbeats
        assert PING_MAX * PING_INTERVAL_S - 0.1 <= at - cut <= SILENT_DETECTION_S + 1.0
        assert orch.recovery.stats["silent_disconnects"] == 1
        proxy.restore()  # the agent reconnects, the same incarnation: alive again
        await events.wait("agent_alive", "quiet", timeout=15.0)
    finally:
        await victim.stop()
        await proxy.stop()
        await events.stop()
        await stop_cluster(orch, agents)
