"""A synthetic edge/fog/cloud cluster with realistic device mixes and link numbers.

Why: MARS's claim is that placement must weigh accelerators and slow WAN links; a uniform
Topcuoglu cluster cannot show that. This builds the shape the design targets: end devices
and edge servers at several sites, a regional fog, a cloud region, joined by LAN/MAN/WAN links.

Composition (n_devices >= 4): about 50% at the edge sites, 20% fog, 30% cloud.
- Edge sites (default one per ~6 devices): positions cycle through an end device (tier
  `device`: camera, phone, headset; ARM CPU, speed 0.1-0.3), an edge server (tier `edge`: mini
  PC / gateway, speed 0.4-0.8, 4 slots) and an accelerator on that server's host (kind gpu or
  npu alternately: Jetson-class GPU or Coral/Hailo-class NPU, speed 2-5). Owned, so $0/hour.
- Fog (one site per ~8 devices): servers of speed 0.8-1.2 with 8 slots, every third a GPU
  (speed 3-5); amortised micro-datacentre cost $0.05-0.40/hour.
- Cloud (one region): every third device, starting with the first, a GPU (speed 6-10, $0.53-
  3.06/hour: AWS g4dn.xlarge to p3.2xlarge on-demand), the rest CPUs (speed 1.0-1.3, 16 slots,
  $0.34-0.68/hour: c5.2xlarge to c5.4xlarge).
Speed 1.0 is one server core; a task's `work` is its seconds on such a core.

Links (`latency_s`, `bandwidth_Bps` in bytes/s, `cost_per_gb`), from the defaults of
iFogSim (Gupta et al., "iFogSim: A toolkit for modeling and simulation of resource management
techniques in the Internet of Things, Edge and Fog computing environments", Software: Practice
and Experience 47(9), 2017) and EdgeCloudSim (Sonmez, Ozgovde, Ersoy, "EdgeCloudSim: An
environment for performance evaluation of edge computing systems", Transactions on Emerging
Telecommunications Technologies 29(11), 2018):
- within an edge or fog site (LAN/WLAN): 4-10 ms, 100 Mbps-1 Gbps;
- edge<->fog, fog<->fog (MAN): 1 Gbps, 8-12 ms; edge<->edge across sites goes through the MAN
  twice: 1 Gbps, the two sites' MAN latencies added;
- edge<->cloud (WAN): 20-50 Mbps, 100-150 ms;
- fog<->cloud (our assumption: a metro PoP with a provisioned uplink): 100 Mbps-1 Gbps,
  50-100 ms;
- inside the cloud region: 0.5 ms, 10 Gbps (datacentre fabric);
- data leaving the cloud costs $0.09/GB (AWS internet egress, first tier); ingress is free.
Every ordered pair of sites is listed, so LinkCostModel's lan/wan defaults are never used.
"""

from __future__ import annotations

import math

import numpy as np

from orchestrator.scheduling.model import Cluster, Device, Link

TIERS = ("device", "edge", "fog", "cloud")
MBPS = 1e6 / 8
"""Bytes per second in one megabit per second."""

LAN_LATENCY_S = (0.004, 0.010)
LAN_BANDWIDTH_BPS = (100 * MBPS, 1000 * MBPS)
MAN_LATENCY_S = (0.008, 0.012)
MAN_BANDWIDTH_BPS = 1000 * MBPS
WAN_LATENCY_S = (0.100, 0.150)
WAN_BANDWIDTH_BPS = (20 * MBPS, 50 * MBPS)
FOG_CLOUD_LATENCY_S = (0.050, 0.100)
FOG_CLOUD_BANDWIDTH_BPS = (100 * MBPS, 1000 * MBPS)
DC_LINK = Link(latency_s=0.0005, bandwidth_Bps=10_000 * MBPS)
CLOUD_EGRESS_PER_GB = 0.09


def _split(n: int) -> tuple[int, int, int]:
    """(edge-site devices, fog, cloud) ~ 50/20/30%, each at least 2/1/1."""
    n_edge = max(2, round(0.5 * n))
    n_fog = max(1, round(0.2 * n))
    return n_edge, n_fog, n - n_edge - n_fog


def _edge_devices(
    rng: np.random.Generator, sites: list[str], count: int, fog_of: dict[str, str]
) -> list[Device]:
    out: list[Device] = []
    base, extra = divmod(count, len(sites))
    per_site = [base + (1 if s < extra else 0) for s in range(len(sites))]
    n_accel = 0
    for site, size in zip(sites, per_site, strict=True):
        labels = {"arch": "arm64", "region": fog_of[site]}
        for p in range(size):
            host = f"{site}-h{(p - 1) // 3}"  # an accelerator shares the CPU's host
            if p % 3 == 0:
                out.append(
                    Device(
                        id=f"{site}-dev{p}",
                        agent_id=f"{site}-end{p // 3}",
                        site=site,
                        tier="device",
                        slots=1,
                        memory_mb=float(rng.choice([1024, 2048, 4096])),
                        speed=float(rng.uniform(0.1, 0.3)),
                        labels=labels,
                    )
                )
            elif p % 3 == 1:
                out.append(
                    Device(
                        id=f"{site}-cpu{p}",
                        agent_id=host,
                        site=site,
                        tier="edge",
                        slots=4,
                        memory_mb=float(rng.choice([8192, 16384])),
                        speed=float(rng.uniform(0.4, 0.8)),
                        labels=labels,
                    )
                )
            else:
                kind = "gpu" if n_accel % 2 == 0 else "npu"
                n_accel += 1
                out.append(
                    Device(
                        id=f"{site}-{kind}{p}",
                        agent_id=host,
                        site=site,
                        tier="edge",
                        kind=kind,
                        slots=1,
                        memory_mb=8192.0,
                        speed=float(rng.uniform(2.0, 5.0)),
                        labels=labels,
                    )
                )
    return out


def _fog_devices(rng: np.random.Generator, sites: list[str], count: int) -> list[Device]:
    out: list[Device] = []
    for p in range(count):
        site = sites[p % len(sites)]
        labels = {"arch": "x86_64", "region": site}
        if p % 3 == 2:
            kind, slots, speed, cost = "gpu", 1, rng.uniform(3.0, 5.0), rng.uniform(0.2, 0.4)
        else:
            kind, slots, speed, cost = "cpu", 8, rng.uniform(0.8, 1.2), rng.uniform(0.05, 0.15)
        out.append(
            Device(
                id=f"{site}-{kind}{p}",
                agent_id=f"{site}-h{p}",
                site=site,
                tier="fog",
                kind=kind,
                slots=slots,
                memory_mb=float(rng.choice([32768, 65536])),
                speed=float(speed),
                labels=labels,
                cost_per_hour=round(float(cost), 3),
            )
        )
    return out


def _cloud_devices(rng: np.random.Generator, site: str, count: int) -> list[Device]:
    out: list[Device] = []
    labels = {"arch": "x86_64", "region": site}
    for p in range(count):
        if p % 3 == 0:
            kind, slots, speed, cost = "gpu", 1, rng.uniform(6.0, 10.0), rng.uniform(0.53, 3.06)
        else:
            kind, slots, speed, cost = "cpu", 16, rng.uniform(1.0, 1.3), rng.uniform(0.34, 0.68)
        out.append(
            Device(
                id=f"{site}-{kind}{p}",
                agent_id=f"{site}-vm{p}",
                site=site,
                tier="cloud",
                kind=kind,
                slots=slots,
                memory_mb=65536.0,
                speed=float(speed),
                labels=labels,
                cost_per_hour=round(float(cost), 3),
            )
        )
    return out


def _uniform(rng: np.random.Generator, lo_hi: tuple[float, float]) -> float:
    return float(rng.uniform(*lo_hi))


def _links(
    rng: np.random.Generator, edge_sites: list[str], fog_sites: list[str], cloud: str
) -> dict[tuple[str, str], Link]:
    links: dict[tuple[str, str], Link] = {}
    for site in [*edge_sites, *fog_sites]:
        links[(site, site)] = Link(_uniform(rng, LAN_LATENCY_S), _uniform(rng, LAN_BANDWIDTH_BPS))
    links[(cloud, cloud)] = DC_LINK
    man = {s: _uniform(rng, MAN_LATENCY_S) for s in edge_sites}
    for a in edge_sites:
        for f in fog_sites:
            links[(a, f)] = Link(_uniform(rng, MAN_LATENCY_S), MAN_BANDWIDTH_BPS)
        for b in edge_sites:
            if a < b:
                links[(a, b)] = Link(man[a] + man[b], MAN_BANDWIDTH_BPS)
    for f in fog_sites:
        for g in fog_sites:
            if f < g:
                links[(f, g)] = Link(_uniform(rng, MAN_LATENCY_S), MAN_BANDWIDTH_BPS)
    for site, lat, bw in [
        *((s, WAN_LATENCY_S, WAN_BANDWIDTH_BPS) for s in edge_sites),
        *((s, FOG_CLOUD_LATENCY_S, FOG_CLOUD_BANDWIDTH_BPS) for s in fog_sites),
    ]:
        latency, bandwidth = _uniform(rng, lat), _uniform(rng, bw)
        links[(site, cloud)] = Link(latency, bandwidth)
        links[(cloud, site)] = Link(latency, bandwidth, cost_per_gb=CLOUD_EGRESS_PER_GB)
    return links


def tiered_cluster(
    n_devices: int,
    *,
    seed: int,
    edge_sites: int | None = None,
    fog_sites: int | None = None,
) -> tuple[Cluster, dict[tuple[str, str], Link]]:
    """A device/edge/fog/cloud cluster of `n_devices` and the links between its sites.

    Pass the links to `LinkCostModel(links)`. Deterministic per `seed`; see the module doc
    for the composition and the sources of the numbers.
    """
    if n_devices < 4:
        raise ValueError("a tiered cluster needs at least 4 devices")
    rng = np.random.default_rng(seed)
    n_edge, n_fog, n_cloud = _split(n_devices)
    n_es = edge_sites if edge_sites is not None else max(1, math.ceil(n_edge / 6))
    n_fs = fog_sites if fog_sites is not None else max(1, math.ceil(n_fog / 8))
    if not (1 <= n_es <= n_edge and 1 <= n_fs <= n_fog):
        raise ValueError("need 1 <= edge_sites <= edge devices and 1 <= fog_sites <= fog devices")
    es = [f"edge{i}" for i in range(n_es)]
    fs = [f"fog{i}" for i in range(n_fs)]
    fog_of = {s: fs[i % n_fs] for i, s in enumerate(es)}
    devices = [
        *_edge_devices(rng, es, n_edge, fog_of),
        *_fog_devices(rng, fs, n_fog),
        *_cloud_devices(rng, "cloud0", n_cloud),
    ]
    return Cluster(devices), _links(rng, es, fs, "cloud0")
