"""Presence over a real nats-server: with sparse (default) heartbeats, a silent link is found by
the server's pings and reported as a disconnect; a drained agent says so at once."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
from nats.aio.msg import Msg

from edge_agent.config import AgentConfig
from schemas import subjects
from schemas.agent import Heartbeat
from schemas.codec import decode
from schemas.placement import DrainCommand, DrainReply
from schemas.presence import PING_INTERVAL_S, PING_MAX, SILENT_DETECTION_S
from sim.linkemu import LinkProxy
from tests.harness import RecordingAgent, agent_config, start_cluster, stop_cluster
from tests.integration.test_recovery import ClusterEvents
from transport.rpc import request, settle

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


async def test_a_drained_agent_heartbeats_at_once_not_at_its_next_beat(nats_url: str) -> None:
    cfg = agent_config("edge", "edge", heartbeat_interval_s=60.0)
    agent = RecordingAgent(nats_url, cfg, agent_id="drained", calibrate=False)
    await agent.start()
    nc = await nats.connect(nats_url)
    beats: asyncio.Queue[Heartbeat] = asyncio.Queue()

    async def on_hb(msg: Msg) -> None:
        await beats.put(decode(msg.data, Heartbeat))

    async def beat(draining: bool) -> None:
        while (await beats.get()).draining != draining:
            pass  # (the beat sent as it started, or one before the command)

    try:
        await nc.subscribe(subjects.heartbeat("drained"), cb=on_hb)
        await settle(nc)
        cmd = DrainCommand(agent_id="drained")
        assert (await request(nc, subjects.drain("drained"), cmd, DrainReply)).draining
        await asyncio.wait_for(beat(True), 5.0)  # not a minute later
        cmd = DrainCommand(agent_id="drained", resume=True)
        await request(nc, subjects.drain("drained"), cmd, DrainReply)
        await asyncio.wait_for(beat(False), 5.0)
    finally:
        await nc.close()
        await agent.stop()
