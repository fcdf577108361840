"""`edge-cloud`: pipelines whose data must cross 20-50 Mbit/s WAN links, every policy.

Setup: `tiered_cluster(48)` (end devices, edge servers with GPU/NPU, fog, cloud; links from
iFogSim/EdgeCloudSim defaults: WAN 20-50 Mbit/s, 100-150 ms), Poisson arrivals of a mix of
video analytics, sensor fusion, AR offload and data-heavy random DAGs (CCR 1, 2 or 5 against
a 35 Mbit/s WAN), duration noise sigma 0.1, no failures. What it shows: how much a
placement that prices data movement gains over ones that do not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.scheduling import LinkCostModel
from sim.des import SimConfig
from sim.des_events import poisson_arrivals
from sim.policies import POLICIES
from sim.report import Setup, Variant, log, policy_table, run_variants, summaries, write_outputs
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


def run(out: Path, seed: int, quick: bool, plots: bool = True) -> dict[str, Any]:
    setup = build(seed, quick)
    log(f"edge-cloud: {setup.params}")
    results = run_variants(setup, [Variant(p, p) for p in POLICIES], seed=seed)
    sums = summaries(setup, results)
    print("edge-cloud: data-heavy edge/cloud pipelines over WAN links (simulated)")
    print(policy_table(sums))
    ll = sums["least-loaded"]["response_s"]["mean"]
    ours = sums["portfolio"]["response_s"]["mean"]
    print(f"\nportfolio mean response vs least-loaded: {100 * (1 - ours / ll):.1f}% shorter")
    files = write_outputs(out, "edge-cloud", setup, results, sums, None, plots)
    print(f"wrote {', '.join(str(f) for f in files)}")
    return {"summary": sums, "files": [str(f) for f in files]}
