"""Discovery, calibration and link probes of real agents over a real nats-server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import nats
import psutil
import pytest
from nats.aio.msg import Msg

from edge_agent.config import AgentConfig
from edge_agent.service import Agent
from orchestrator.placement.registry import ClusterView
from schemas import subjects
from schemas.agent import AgentAdvert, CalibrationDrift, Heartbeat
from schemas.codec import ERROR_HEADER, decode
from schemas.limits import MAX_PROBE_BYTES
from tests.harness import agent_config
from transport.rpc import settle

pytestmark = pytest.mark.integration

NO_ACCEL = {"probe_gpus": False, "probe_accelerators": False}


class AdvertWatch:
    """Latest advert per agent, and a wait for a condition over them (no polling)."""

    def __init__(self) -> None:
        self.latest: dict[str, AgentAdvert] = {}
        self._changed = asyncio.Condition()

    async def on_msg(self, msg: Msg) -> None:
        adv = decode(msg.data, AgentAdvert)
        async with self._changed:
            self.latest[adv.agent_id] = adv
            self._changed.notify_all()

    async def wait(self, pred: Callable[[dict[str, AgentAdvert]], bool], timeout: float) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: pred(self.latest)), timeout)


async def test_advert_reflects_this_host_and_declared_devices(nats_url: str) -> None:
    cfg = agent_config(
        "plant-a",
        "edge",
        **NO_ACCEL,
        devices=[
            {"device_id": "gpu7", "kind": "gpu", "gflops": 9000.0, "memory_mb": 16384.0},
            {"device_id": "npu0", "kind": "npu", "gflops": 80.0, "emulated": True},
        ],
    )
    nc = await nats.connect(nats_url)
    watch = AdvertWatch()
    await nc.subscribe(subjects.advert("host-1"), cb=watch.on_msg)
    await settle(nc)
    agent = Agent(nats_url, cfg, agent_id="host-1", calibrate=False)
    try:
        await agent.start()
        await watch.wait(lambda a: "host-1" in a, 5.0)
        devs = {d.device_id: d for d in watch.latest["host-1"].devices}
    finally:
        await agent.stop()
        await nc.drain()
    cpu, gpu, npu = devs["cpu0"], devs["gpu7"], devs["npu0"]
    assert cpu.cores == psutil.cpu_count(logical=True)
    total_mb = psutil.virtual_memory().total / 2**20
    assert abs(cpu.memory_mb - total_mb) <= 0.01 * total_mb
    assert not cpu.emulated and cpu.model_name
    assert gpu.gflops == 9000.0 and not gpu.emulated and not gpu.calibrated
    assert npu.emulated and not npu.calibrated and npu.mem_bandwidth_gbps == 0.0


async def test_calibrated_agent_advertises_measurements_and_reports_drift(nats_url: str) -> None:
    cfg = agent_config(
        "plant-a",
        "edge",
        **NO_ACCEL,
        heartbeat_interval_s=0.1,
        recalibrate_every_s=0.2,
        devices=[{"device_id": "npu0", "kind": "npu", "gflops": 80.0, "emulated": True}],
    )
    nc = await nats.connect(nats_url)
    watch = AdvertWatch()
    drift: asyncio.Future[CalibrationDrift] = asyncio.get_running_loop().create_future()

    async def on_drift(msg: Msg) -> None:
        if not drift.done():
            drift.set_result(decode(msg.data, CalibrationDrift))

    await nc.subscribe(subjects.advert("cal-1"), cb=watch.on_msg)
    await nc.subscribe(subjects.ALL_DRIFT, cb=on_drift)
    await settle(nc)
    t0 = time.perf_counter()
    agent = Agent(nats_url, cfg, agent_id="cal-1")  # calibrates at start
    start_s = time.perf_counter() - t0
    cpu = agent.devices[0]
    assert cpu.calibrated and cpu.gflops > 0.5 and cpu.mem_bandwidth_gbps > 0.1
    assert 0.0 < cpu.call_overhead_ms < 100.0
    assert start_s < 5.0, f"calibration took {start_s:.2f}s"
    throttled = round(cpu.gflops * 0.5, 3)
    agent.recal.measure = lambda: throttled  # the host now runs at half speed
    try:
        await agent.start()
        notice = await asyncio.wait_for(drift, 5.0)
        await watch.wait(lambda a: "cal-1" in a and a["cal-1"].devices[0].gflops == throttled, 5.0)
    finally:
        await agent.stop()
        await nc.drain()
    assert notice.agent_id == "cal-1" and notice.device_id == "cpu0"
    assert notice.baseline == notice.previous == cpu.gflops and notice.current == throttled
    assert notice.change == pytest.approx(-0.5, abs=1e-3)
    npu = next(d for d in watch.latest["cal-1"].devices if d.device_id == "npu0")
    assert npu.gflops == 80.0 and npu.emulated and not npu.calibrated  # never measured


async def test_probe_answers_are_bounded(nats_url: str) -> None:
    agent = Agent(nats_url, agent_config("s", "edge", **NO_ACCEL), agent_id="p-1", calibrate=False)
    nc = await nats.connect(nats_url)
    try:
        await agent.start()
        subject = subjects.probe("p-1")
        small = await nc.request(subject, b"ping-1234", timeout=2.0)
        assert small.data == b"ping-1234"
        bulk = await nc.request(subject, bytes(100_000), timeout=2.0)
        assert bulk.data == b"100000"  # acknowledged, never echoed
        hostile = await nc.request(subject, bytes(MAX_PROBE_BYTES + 1), timeout=2.0)
        assert hostile.headers is not None
        assert hostile.headers[ERROR_HEADER] == "payload_too_large"
        assert len(hostile.data) < 200
        again = await nc.request(subject, b"x", timeout=2.0)  # still serving
        assert again.data == b"x"
    finally:
        await agent.stop()
        await nc.drain()


def _measured(adv: AgentAdvert, site: str) -> bool:
    return any(link.measured and link.to_site == site for link in adv.links)


async def test_link_probes_between_sites_reach_adverts_and_the_link_model(nats_url: str) -> None:
    wan = {"latency_ms": 100.0, "bandwidth_mbps": 25.0, "cost_per_gb": 0.09}
    common: dict[str, Any] = {**NO_ACCEL, "heartbeat_interval_s": 0.1, "link_probe_every_s": 0.3}
    configs: dict[str, AgentConfig] = {
        "n-1": agent_config(
            "north",
            "edge",
            **common,
            links=[{"to_site": "south", **wan}, {"to_site": "cloud", **wan}],
        ),
        "n-2": agent_config("north", "edge", **common),
        "s-1": agent_config("south", "edge", **common),
    }
    nc = await nats.connect(nats_url)
    watch = AdvertWatch()
    view = ClusterView(misses=100)

    async def on_advert(msg: Msg) -> None:
        view.on_advert(decode(msg.data, AgentAdvert), time.monotonic())
        await watch.on_msg(msg)

    async def on_hb(msg: Msg) -> None:
        view.on_heartbeat(decode(msg.data, Heartbeat), time.monotonic())

    await nc.subscribe(subjects.ALL_ADVERTS, cb=on_advert)
    await nc.subscribe(subjects.ALL_HEARTBEATS, cb=on_hb)
    await settle(nc)
    agents = [Agent(nats_url, cfg, agent_id=aid, calibrate=False) for aid, cfg in configs.items()]

    def all_measured(a: dict[str, AgentAdvert]) -> bool:
        return (
            len(a) == 3
            and all(_measured(a[n], "south") and _measured(a[n], "north") for n in ("n-1", "n-2"))
            and _measured(a["s-1"], "north")
        )

    try:
        for agent in agents:
            await agent.start()
        await watch.wait(all_measured, 8.0)
        cluster, links = view.snapshot(time.monotonic())
    finally:
        for agent in agents:
            await agent.stop()
        await nc.drain()
    n1 = {link.to_site: link for link in watch.latest["n-1"].links}
    south = n1["south"]
    assert south.measured and 0.0 < 2 * south.latency_ms < 100.0  # RTT on loopback
    assert south.bandwidth_mbps > 1.0 and south.jitter_ms >= 0.0
    assert south.cost_per_gb == 0.09  # not measured: carried over from the declaration
    assert not n1["cloud"].measured and n1["cloud"].latency_ms == 100.0  # never probed: kept
    assert n1["north"].measured  # the same-site (LAN) link, from the other north agent
    s1 = {link.to_site: link for link in watch.latest["s-1"].links}
    assert "south" not in s1  # no other agent at its own site to probe
    assert len(cluster.devices) == 3
    ns = links[("north", "south")]  # measured by n-1 and n-2 beats n-1's declared 100 ms
    assert 0.0 < ns.latency_s < 0.05 and ns.bandwidth_Bps > 1e6 / 8
    assert 0.0 < links[("south", "north")].latency_s < 0.05
    assert links[("north", "north")].bandwidth_Bps > 1e6 / 8
    assert links[("north", "cloud")].latency_s == pytest.approx(0.1)  # declared only
