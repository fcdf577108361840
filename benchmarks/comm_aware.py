"""Communication-aware placement against what default cluster schedulers do.

    python -m benchmarks.comm_aware [--devices 32] [--seeds 3]

Edge/fog/cloud cluster with WAN links of 20-50 Mbps and 100-150 ms (EdgeCloudSim/iFogSim
defaults), data-heavy pipelines (CCR >= 1 against the WAN) and the edge application pipelines.
Prints each policy's makespan and how much shorter our portfolio's is than least-loaded's
(goal: >= 30% on data-heavy pipelines), and a lower bound on any plan's makespan (every task
as early as its inputs can arrive, devices never busy), which says how much shorter than
least-loaded any plan could be at all.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from benchmarks.common import median, table
from orchestrator.scheduling import (
    Cluster,
    Link,
    LinkCostModel,
    Plan,
    TaskGraph,
    earliest_start,
    heft,
    least_loaded,
    portfolio,
    round_robin,
    weighted_random,
)
from orchestrator.scheduling.engine import Prepared
from sim.workloads import ar_offload, random_dag, sensor_fusion, tiered_cluster, video_analytics

FREE = Link(latency_s=0.0, bandwidth_Bps=1e30)
WAN_BPS = 35e6 / 8  # the middle of 20-50 Mbps, in bytes/s


def comm_blind(graph: TaskGraph, cluster: Cluster, cost: LinkCostModel) -> Plan:
    """HEFT that believes data moves for free, then timed on the real links: each task pinned
    to the device the blind plan chose, planned again under the true cost model."""
    free = LinkCostModel({}, lan=FREE, wan=FREE, local_Bps=1e30)
    blind = heft(graph, cluster, free)
    pinned = [replace(t, pinned=blind.placements[t.id].device_id) for t in graph]
    return replace(
        heft(TaskGraph(pinned, dict(graph.edges)), cluster, cost), algorithm="heft-comm-blind"
    )


def contention_free_bound(graph: TaskGraph, cluster: Cluster, cost: LinkCostModel) -> float:
    """A lower bound on the makespan of every valid plan: each task on each device finishes
    no earlier than its compute time after the latest of its inputs, each from the producer's
    best device over the real link; only waiting for a busy slot is left out."""
    prep = Prepared(graph, cluster, cost, None, 0.0)
    dense = prep.table.dense()
    if dense is None:
        raise ValueError("bound needs a cluster small enough for dense link matrices")
    lat, bw = dense
    w = prep.w
    finish = np.zeros_like(w)
    for i in graph.topo:
        start = np.zeros(len(cluster))
        for p, nbytes in graph.preds[i]:
            arrive = (finish[p][:, None] + (nbytes / bw + lat)).min(axis=0)
            np.maximum(start, arrive, out=start)
        finish[i] = start + w[i]
    return float(finish.min(axis=1).max()) if len(graph) else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--devices", type=int, default=32)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args(argv)
    rows = []
    gains: list[float] = []
    possible: list[float] = []  # per data-heavy case: the most any plan could gain
    blind_gains: list[float] = []
    for seed in range(1, args.seeds + 1):
        cluster, links = tiered_cluster(args.devices, seed=seed)
        cost = LinkCostModel(links)
        work: list[tuple[str, TaskGraph, bool]] = [
            (
                f"random v=100 CCR {ccr}",
                random_dag(100, ccr=ccr, seed=seed, bandwidth_Bps=WAN_BPS),
                ccr >= 1.0,
            )
            for ccr in (0.1, 1.0, 2.0, 5.0, 10.0)
        ]
        work += [
            ("video analytics x4", video_analytics(streams=4), True),
            ("AR offload", ar_offload(), True),
            ("sensor fusion x8", sensor_fusion(sensors=8), True),
        ]
        for name, graph, heavy in work:
            plans: dict[str, Plan] = {
                "portfolio": portfolio(graph, cluster, cost),
                "heft": heft(graph, cluster, cost),
                "comm_blind_heft": comm_blind(graph, cluster, cost),
                "least_loaded": least_loaded(graph, cluster, cost),
                "round_robin": round_robin(graph, cluster, cost),
                "weighted_random": weighted_random(graph, cluster, cost, seed=seed),
                "earliest_start": earliest_start(graph, cluster, cost),
            }
            for key, p in plans.items():
                if key != "comm_blind_heft":  # planned on a pinned copy of the graph
                    p.validate(graph, cluster, cost)
            ll, ours = plans["least_loaded"].makespan, plans["portfolio"].makespan
            gain = 1.0 - ours / ll if ll > 0 else 0.0
            bound = contention_free_bound(graph, cluster, cost)
            if ours < bound * (1 - 1e-9):
                raise AssertionError(f"{name}: makespan {ours} below the lower bound {bound}")
            best_gain = 1.0 - bound / ll if ll > 0 else 0.0
            if heavy:
                gains.append(gain)
                possible.append(best_gain)
                blind = plans["comm_blind_heft"].makespan
                blind_gains.append(1.0 - ours / blind if blind > 0 else 0.0)
            rows.append(
                [
                    f"seed {seed}",
                    name,
                    "yes" if heavy else "no",
                    *(plans[k].makespan for k in plans),
                    bound,
                    f"{100 * gain:.1f}%",
                    f"{100 * best_gain:.1f}%",
                ]
            )
    print(
        table(
            rows,
            [
                "cluster",
                "pipeline",
                "data-heavy",
                "portfolio",
                "heft",
                "comm-blind heft",
                "least_loaded",
                "round_robin",
                "weighted_random",
                "earliest_start",
                "lower bound",
                "shorter than least_loaded",
                "most possible",
            ],
        )
    )
    print(
        f"\ndata-heavy pipelines: portfolio shorter than comm-blind HEFT (same scheduler, links "
        f"ignored when planning) by median {100 * median(blind_gains):.1f}%, min "
        f"{100 * min(blind_gains):.1f}%"
    )
    at_least = sum(1 for g in gains if g >= 0.30)
    print(f"data-heavy cases with >= 30% gain over least-loaded: {at_least}/{len(gains)}")
    reachable = [g for g, most in zip(gains, possible, strict=True) if most >= 0.30]
    print(
        f"data-heavy cases where any plan could be >= 30% shorter than least-loaded (lower "
        f"bound): {len(reachable)}/{len(gains)}; of those, ours is: "
        f"{sum(1 for g in reachable if g >= 0.30)}/{len(reachable)}"
    )
    print(
        f"data-heavy pipelines: portfolio makespan shorter than least-loaded by median "
        f"{100 * median(gains):.1f}%, min {100 * min(gains):.1f}% over {len(gains)} cases "
        "(goal: >= 30%)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
