"""A fleet of real MARS agents in one asyncio process, for benchmarks and integration tests.

Every agent here is a real `edge_agent.service.Agent` with its own incarnation, subscriptions,
heartbeats, admission and executors, and by default its own NATS connection (with `shared`,
the fleet's agents share one: `edge_agent.sharedconn`, their messages unchanged); what is *not*
real is the hardware. Each agent skips the
CPU probe (`probe_cpu: false`) and declares exactly one device marked `emulated: true` (kind
cpu, with the slots and GFLOP/s it is given), so the orchestrator and every report can tell
these devices exist only by declaration: nothing about them was measured. Calibration is off.
Synthetic tasks (sleep/busy) run for real on this host; other task kinds would too, but the
speeds the scheduler plans with are the declared ones.

Agents are spread round-robin over `site_count` sites (`<prefix>-site-<k>`) that declare LAN-like
links to each other, so plans see a few sites without any WAN cost dominating.

`synthetic_pipeline` builds the small random pipelines the benchmarks drive the fleet with; it
is pure and deterministic for a given `random.Random`.
"""

from __future__ import annotations

import asyncio
import logging
import random

from edge_agent.config import AgentConfig
from edge_agent.service import Agent
from edge_agent.sharedconn import SharedConnection
from schemas.agent import DeviceSpec, LinkSpec
from schemas.pipeline import PipelineSpec, SyntheticRun, TaskSpec

log = logging.getLogger("mars.sim.fleet")

#: Declared cost of reaching another site of the fleet (all on one host, so LAN-like).
SITE_LINK_LATENCY_MS = 2.0
SITE_LINK_MBPS = 1000.0
#: Agents connecting at once while the fleet starts.
START_CONCURRENCY = 32


def site_name(prefix: str, k: int) -> str:
    return f"{prefix}-site-{k}"


def agent_name(prefix: str, i: int) -> str:
    return f"{prefix}-{i:04d}"


def fleet_configs(
    count: int,
    *,
    prefix: str = "sim",
    slots: int = 2,
    gflops: float = 50.0,
    site_count: int = 4,
    heartbeat_s: float = 0.5,
    state_dir: str | None = None,
) -> dict[str, AgentConfig]:
    """Agent id -> config, each with one emulated cpu device and no probing. `state_dir`:
    each agent's journal and outputs under `state_dir/<id>`, kept when it stops (else a
    temp directory of its own, removed when it stops cleanly, left behind if it is killed)."""
    if count < 1:
        raise ValueError("count must be >= 1")
    if site_count < 1:
        raise ValueError("site_count must be >= 1")
    sites = [site_name(prefix, k) for k in range(min(site_count, count))]
    out: dict[str, AgentConfig] = {}
    for i in range(count):
        site = sites[i % len(sites)]
        device = DeviceSpec(
            device_id="cpu0",
            kind="cpu",
            slots=slots,
            gflops=gflops,
            emulated=True,
            model_name="emulated cpu (sim fleet)",
            labels={"mars/emulated": "true"},
        )
        links = [
            LinkSpec(to_site=s, latency_ms=SITE_LINK_LATENCY_MS, bandwidth_mbps=SITE_LINK_MBPS)
            for s in sites
            if s != site
        ]
        out[agent_name(prefix, i)] = AgentConfig(
            site=site,
            tier="edge",
            labels={"mars/fleet": prefix},
            probe_cpu=False,
            devices=[device],
            links=links,
            allowed_kinds=["synthetic"],
            heartbeat_interval_s=heartbeat_s,
            # emulated devices and links: nothing of this host may be probed or measured
            probe_gpus=False,
            probe_accelerators=False,
            link_probe_every_s=0.0,
            recalibrate_every_s=0.0,
            buffer_dir=state_dir,
        )
    return out


async def start_fleet(
    url: str, configs: dict[str, AgentConfig], *, shared: str | None = None
) -> list[Agent]:
    """Start one Agent per config (bounded concurrency); all started or none left running.
    `shared`: the name of one NATS connection they all use (else one each)."""
    conn = None
    if shared is not None and configs:
        first = next(iter(configs.values()))
        conn = SharedConnection(
            url,
            shared,
            reconnect_base_s=first.reconnect_base_s,
            reconnect_max_s=first.reconnect_max_s,
        )
    agents = [
        Agent(url, cfg, agent_id=aid, calibrate=False, shared=conn) for aid, cfg in configs.items()
    ]
    gate = asyncio.Semaphore(START_CONCURRENCY)

    async def start(agent: Agent) -> None:
        async with gate:
            await agent.start()

    results = await asyncio.gather(*(start(a) for a in agents), return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        await stop_fleet(agents)
        raise RuntimeError(f"{len(failed)} of {len(agents)} agents failed to start: {failed[0]!r}")
    return agents


async def stop_fleet(agents: list[Agent]) -> None:
    """Stop every agent (those that never started are stopped harmlessly), then close the
    connection they shared, if they did."""
    results = await asyncio.gather(*(a.stop() for a in agents), return_exceptions=True)
    for agent, r in zip(agents, results, strict=True):
        if isinstance(r, BaseException):
            log.warning("stopping agent %s failed: %r", agent.agent_id, r)
    for conn in {id(a.shared): a.shared for a in agents if a.shared is not None}.values():
        await conn.close()


async def run_fleet(
    url: str,
    count: int,
    *,
    prefix: str = "sim",
    slots: int = 2,
    gflops: float = 50.0,
    site_count: int = 4,
    heartbeat_s: float = 0.5,
    shared_connection: bool = False,
    state_dir: str | None = None,
    stop: asyncio.Event,
    started: asyncio.Event | None = None,
) -> None:
    """Run `count` emulated agents against `url` until `stop` is set; `started` is set once
    every agent has connected and advertised. `shared_connection`: all on one connection."""
    configs = fleet_configs(
        count,
        prefix=prefix,
        slots=slots,
        gflops=gflops,
        site_count=site_count,
        heartbeat_s=heartbeat_s,
        state_dir=state_dir,
    )
    agents = await start_fleet(url, configs, shared=prefix if shared_connection else None)
    log.info(
        "sim fleet up: %d agents with emulated devices (%d slots, %.1f GFLOP/s) on %d sites, %s",
        len(agents),
        slots,
        gflops,
        min(site_count, count),
        "sharing one NATS connection" if shared_connection else "one NATS connection each",
    )
    try:
        if started is not None:
            started.set()
        await stop.wait()
    finally:
        await stop_fleet(agents)


def synthetic_pipeline(
    rng: random.Random,
    name: str,
    *,
    tasks: int | tuple[int, int],
    seconds: tuple[float, float] = (0.001, 0.005),
    max_deps: int = 3,
    output_bytes: tuple[int, ...] = (0, 64, 1024),
) -> PipelineSpec:
    """A random DAG of synthetic sleep tasks `t0..t{n-1}` (each task depends on up to
    `max_deps` earlier ones, so chains, fan-outs, fan-ins and independent tasks all occur)."""
    n = tasks if isinstance(tasks, int) else rng.randint(*tasks)
    lo, hi = seconds
    specs: list[TaskSpec] = []
    for i in range(n):
        k = rng.randint(0, min(i, max_deps))
        deps = sorted(rng.sample(range(i), k))
        run = SyntheticRun(
            mode="sleep",
            seconds=round(rng.uniform(lo, hi), 6),
            output_bytes=rng.choice(output_bytes),
        )
        specs.append(TaskSpec(id=f"t{i}", run=run, deps=[f"t{d}" for d in deps]))
    return PipelineSpec(name=name, tasks=specs)
