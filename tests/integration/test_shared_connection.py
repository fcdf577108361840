"""Agents of one process on one NATS connection (`edge_agent.sharedconn`, `mars sim agents
--shared-connection`), over a real nats-server: one client for the fleet, each agent still
answering on its own subjects only, one agent's stop ending only its subscriptions, and a lost
connection reported to every agent on it, and its return too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import nats.errors
import pytest

from edge_agent.service import Agent
from edge_agent.sharedconn import SHARED_CLIENT_PREFIX, SharedConnection
from orchestrator.infra.natsserver import EmbeddedNats
from orchestrator.reliability.recovery import AGENT_CLIENT_PREFIX
from schemas import subjects
from sim.fleet import fleet_configs, start_fleet, stop_fleet
from sim.linkemu import LinkProxy

pytestmark = pytest.mark.integration

COUNT = 4


async def test_a_shared_fleet_is_one_client_of_the_server(tmp_path: Path) -> None:
    with EmbeddedNats(store_dir=str(tmp_path / "nats"), monitor=True) as srv:
        agents = await start_fleet(srv.url, fleet_configs(COUNT, prefix="sh"), shared="sh")
        try:
            names = await asyncio.to_thread(srv.traffic)
            assert [n for n in names if n.startswith(SHARED_CLIENT_PREFIX)] == ["mars-agents-sh"]
            assert not [n for n in names if n.startswith(AGENT_CLIENT_PREFIX)]
            assert len({id(a.nc) for a in agents}) == 1
        finally:
            await stop_fleet(agents)
        assert all(a.nc is None for a in agents)
        assert agents[0].shared is not None and agents[0].shared.nc is None  # closed by the fleet


async def test_each_agent_answers_its_own_subjects_and_a_stop_ends_only_its_own(
    nats_url: str,
) -> None:
    agents = await start_fleet(nats_url, fleet_configs(3, prefix="own"), shared="own")
    nc = await nats.connect(nats_url)
    try:
        for a in agents:  # a small probe is echoed by the agent it is addressed to
            reply = await nc.request(subjects.probe(a.agent_id), a.agent_id.encode(), timeout=5)
            assert reply.data == a.agent_id.encode()
        gone, *rest = agents
        await gone.stop()
        with pytest.raises(nats.errors.NoRespondersError):
            await nc.request(subjects.probe(gone.agent_id), b"x", timeout=5)
        for a in rest:
            assert a.nc is not None and a.nc.is_connected
            reply = await nc.request(subjects.probe(a.agent_id), b"still", timeout=5)
            assert reply.data == b"still"
    finally:
        await nc.close()
        await stop_fleet(agents)


async def test_a_lost_shared_connection_takes_every_agent_offline_and_back(
    nats_server: EmbeddedNats,
) -> None:
    proxy = LinkProxy(nats_server.host, nats_server.port)
    await proxy.start()
    port = proxy.port
    conn = SharedConnection(proxy.url, "lost", reconnect_base_s=0.05, reconnect_max_s=0.2)
    agents = [
        Agent(proxy.url, cfg, agent_id=aid, calibrate=False, shared=conn)
        for aid, cfg in fleet_configs(3, prefix="lost").items()
    ]
    back: LinkProxy | None = None
    try:
        for a in agents:
            await a.start()
        assert conn.members == 3 and all(a.online.is_set() for a in agents)
        await proxy.stop()  # the socket drops and nothing listens
        async with asyncio.timeout(10):
            for a in agents:
                await a.offline.wait()
        assert not any(a.online.is_set() for a in agents)
        back = LinkProxy(nats_server.host, nats_server.port, listen_port=port)
        await back.start()
        async with asyncio.timeout(15):
            for a in agents:
                await a.online.wait()
        assert not any(a.offline.is_set() for a in agents)
    finally:
        for a in agents:
            await a.stop()
        assert conn.members == 0
        await conn.close()
        if back is not None:
            await back.stop()
        await proxy.stop()
