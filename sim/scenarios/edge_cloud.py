"""`edge-cloud`: pipelines whose data must cross 20-50 Mbit/s WAN links, every policy.

Setup: `tiered_cluster(48)` (end devices, edge servers with GPU/NPU, fog, cloud; links from
iFogSim/EdgeCloudSim defaults: WAN 20-50 Mbit/s, 100-150 ms), Poisson arrivals of a mix of
video analytics, sensor fusion, AR offload and data-heavy random DAGs (CCR 1, 2 or 5 against
a 35 Mbit/s WAN), duration noise sigma 0.1, no failures. What it shows: how much a
placement that prices data movement gains over ones that do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.scheduling import LinkCostModel
from sim.des import SimConfig
from sim.des_events import poisson_arrivals
from sim.policies import POLICIES
from sim.report import (
    Setup,
    Variant,
    policy_table,
    ratio_line,
    run_seeds,
    seeds_note,
    write_outputs,
)
from sim.scenarios.workload import MBPS, edge_mix
from sim.workloads import tiered_cluster

WAN_BPS = 35 * MBPS


def build(seed: int, quick: bool) -> Setup:
    n_pipes = 30 if quick else 150
    rate = 0.05
    cluster, links = tiered_cluster(48, seed=seed)
    graphs = edge_mix(n_pipes, seed=seed, wan_Bps=WAN_BPS)
    arrivals = poisson_arrivals(graphs, rate, seed=seed)
    return Setup(
        cluster=cluster,
        cost=LinkCostModel(links),
        arrivals=arrivals,
        config=SimConfig(noise_sigma=0.1, seed=seed),
        params={
            "devices": len(cluster),
            "pipelines": n_pipes,
            "tasks": sum(len(g) for g in graphs),
            "arrival_rate_per_s": rate,
            "wan": "20-50 Mbit/s, 100-150 ms (tiered_cluster)",
            "workload": "video analytics, sensor fusion, AR offload, random DAGs CCR 1/2/5",
        },
    )


def run(out: Path, seeds: Sequence[int], quick: bool, plots: bool = True) -> dict[str, Any]:
    variants = [Variant(p, p) for p in POLICIES]
    runs = run_seeds(build, variants, seeds, quick, "edge-cloud")
    print("edge-cloud: data-heavy edge/cloud pipelines over WAN links (simulated), no failures")
    print(seeds_note(runs))
    print(policy_table(runs, variants, recovery=False))
    print()
    print(
        ratio_line(runs, variants, "portfolio", "mean response", lambda s: s["response_s"]["mean"])
    )
    files = write_outputs(out, "edge-cloud", runs, variants, None, plots)
    print(f"\nwrote {', '.join(str(f) for f in files)}")
    return {"runs": runs, "files": [str(f) for f in files]}
