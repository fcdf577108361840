"""Clusters and pipeline mixes the scenarios share.

Why here and not in `sim.workloads`: these are scenario choices (a 100-node CPU/GPU pool,
a CPU/GPU task mix), built from the general generators there.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from orchestrator.scheduling import Cluster, Device, Link, TaskGraph
from sim.workloads import ar_offload, random_dag, sensor_fusion, video_analytics

GBPS = 1e9 / 8
MBPS = 1e6 / 8

#: Inside one rack / site of the pool: 10 Gbps, 0.5 ms (datacentre fabric, as `tiered`).
RACK_LINK = Link(latency_s=0.0005, bandwidth_Bps=10 * GBPS)
#: Between racks / sites of the pool: 1 Gbps, 5 ms.
POOL_LINK = Link(latency_s=0.005, bandwidth_Bps=1 * GBPS)

CPU_ONLY = frozenset({"cpu"})
GPU_FRIENDLY = frozenset({"cpu", "gpu"})


def mixed_pool(
    nodes: int, *, seed: int, gpu_every: int = 5, gpus_per: int = 2, sites: int = 4
) -> tuple[Cluster, dict[tuple[str, str], Link]]:
    """`nodes` servers over `sites` racks: each has a CPU device (4 slots, speed 0.8-1.2,
    one server core = 1.0) and `gpus_per` of every `gpu_every` nodes also have a GPU (1 slot,
    speed 4-8 on GPU-friendly work) on the same host. Default: 40% of nodes with a GPU."""
    rng = np.random.default_rng(seed)
    devices: list[Device] = []
    for n in range(nodes):
        site = f"rack{n % sites}"
        agent = f"node{n:04d}"
        devices.append(
            Device(
                id=f"{agent}-cpu",
                agent_id=agent,
                site=site,
                tier="fog",
                kind="cpu",
                slots=4,
                memory_mb=65536.0,
                speed=float(rng.uniform(0.8, 1.2)),
            )
        )
        if n % gpu_every < gpus_per:
            devices.append(
                Device(
                    id=f"{agent}-gpu",
                    agent_id=agent,
                    site=site,
                    tier="fog",
                    kind="gpu",
                    slots=1,
                    memory_mb=16384.0,
                    speed=float(rng.uniform(4.0, 8.0)),
                )
            )
    names = [f"rack{s}" for s in range(sites)]
    links = {(a, b): RACK_LINK if a == b else POOL_LINK for a in names for b in names}
    return Cluster(devices), links


def cpu_gpu_dag(
    v: int, *, seed: int, gpu_share: float = 0.4, ccr: float = 0.5, bandwidth_Bps: float = GBPS
) -> TaskGraph:
    """A random DAG (Topcuoglu generator, mean work 1 s) whose tasks are either CPU-only or
    GPU-friendly (may run on a CPU or, at the GPU's speed, on a GPU), about `gpu_share` of
    them the latter: the mixed CPU/GPU load of the seed's table."""
    g = random_dag(v, ccr=ccr, seed=seed, mean_work=1.0, bandwidth_Bps=bandwidth_Bps)
    pick = np.random.default_rng(seed + 7919).random(v) < gpu_share
    tasks = [replace(t, kinds=GPU_FRIENDLY if pick[k] else CPU_ONLY) for k, t in enumerate(g.tasks)]
    return TaskGraph(tasks, g.edges)


def edge_mix(count: int, *, seed: int, wan_Bps: float) -> list[TaskGraph]:
    """Edge/cloud pipelines where data movement matters: data-heavy random DAGs (CCR 1-5
    against the WAN) interleaved with the three edge applications."""
    rng = np.random.default_rng(seed)
    out: list[TaskGraph] = []
    for k in range(count):
        kind = k % 5
        if kind == 0:
            out.append(video_analytics(streams=int(rng.integers(2, 5))))
        elif kind == 1:
            out.append(sensor_fusion(sensors=int(rng.integers(4, 12))))
        elif kind == 2:
            out.append(ar_offload())
        else:
            ccr = float(rng.choice([1.0, 2.0, 5.0]))
            v = int(rng.integers(20, 61))
            out.append(random_dag(v, ccr=ccr, seed=seed * 1000 + k, bandwidth_Bps=wan_Bps))
    return out
