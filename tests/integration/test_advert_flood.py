"""One identity advertising in a loop (its permissions let it advertise as itself, as often
as it likes) neither takes the replica from the other agents nor loses what it last said."""

from __future__ import annotations

import asyncio

import nats

from orchestrator.service import Orchestrator
from schemas import AgentAdvert, DeviceSpec, subjects
from schemas.codec import encode

FLOOD = 5_000


def advert(aid: str, zone: str, seq: int = 0) -> AgentAdvert:
    return AgentAdvert(
        agent_id=aid, incarnation="i1", site="s", tier="edge", labels={"zone": zone}, seq=seq,
        devices=[DeviceSpec(device_id="cpu0", kind="cpu", slots=1, gflops=10.0)],
    )  # fmt: skip


async def test_advert_flood_is_coalesced_latest_wins(nats_url: str) -> None:
    orch = Orchestrator(nats_url, name="orch")
    await orch.start()
    nc = await nats.connect(nats_url)
    try:
        for i in range(FLOOD):
            await nc.publish(subjects.advert("loud"), encode(advert("loud", f"z{i}", i)))
        await nc.publish(subjects.advert("quiet"), encode(advert("quiet", "calm")))
        await nc.flush()

        def settled() -> bool:
            loud, quiet = orch.view.agents.get("loud"), orch.view.agents.get("quiet")
            return (
                quiet is not None
                and loud is not None
                and loud.advert.labels.get("zone") == f"z{FLOOD - 1}"
            )

        async with asyncio.timeout(20.0):  # woken by every advert applied
            while not settled():
                orch.cluster_changed.clear()
                await orch.cluster_changed.wait()
        # the flood was mostly never decoded: replaced by a later advert of the same agent
        assert orch.advert_stats()["coalesced"] >= FLOOD // 2
    finally:
        await nc.close()
        await orch.stop()
