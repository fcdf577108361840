"""`scale-10k`: 10,000 devices and 10,000 tasks (100 pipelines x 100 tasks) simulated.

Setup: `tiered_cluster(10000)` (~54,000 slots), 100 random DAGs of 100 tasks (CCR 1 against
a 35 Mbit/s WAN), Poisson arrivals, noise sigma 0.2, two node failures and two slowdowns.
Policies: portfolio and HEFT (each on ~64 pre-filtered candidate devices) and least-loaded
(on all 10,000). Reports the simulated outcome and the real wall-clock time of each run.
`--quick`: 1,000 devices and 1,000 tasks.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from orchestrator.scheduling import LinkCostModel
from sim.des import SimConfig
from sim.des_events import Failure, Slowdown, poisson_arrivals
from sim.report import (
    Setup,
    Variant,
    log,
    policy_table,
    run_variants,
    summaries,
    table,
    write_outputs,
)
from sim.scenarios.workload import MBPS
from sim.workloads import random_dag, tiered_cluster


def build(seed: int, quick: bool) -> Setup:
    devices = 1_000 if quick else 10_000
    pipes, size = (10, 100) if quick else (100, 100)
    t0 = time.perf_counter()
    cluster, links = tiered_cluster(devices, seed=seed)
    graphs = [
        random_dag(size, ccr=1.0, seed=seed * 1000 + k, bandwidth_Bps=35 * MBPS)
        for k in range(pipes)
    ]
    arrivals = poisson_arrivals(graphs, 0.5, seed=seed)
    end = arrivals[-1].at
    return Setup(
        cluster=cluster,
        cost=LinkCostModel(links),
        arrivals=arrivals,
        failures=[Failure(end * 0.3), Failure(end * 0.7)],
        slowdowns=[Slowdown(end * 0.2, 0.25), Slowdown(end * 0.6, 0.25)],
        config=SimConfig(noise_sigma=0.2, seed=seed),
        params={
            "devices": len(cluster),
            "slots": sum(cluster.slots),
            "pipelines": pipes,
            "tasks": sum(len(g) for g in graphs),
            "arrival_rate_per_s": 0.5,
            "build_s": time.perf_counter() - t0,
        },
    )


def run(out: Path, seed: int, quick: bool, plots: bool = True) -> dict[str, Any]:
    setup = build(seed, quick)
    log(f"scale-10k: {setup.params}")
    variants = [Variant(p, p) for p in ("portfolio", "heft", "least-loaded")]
    results = run_variants(setup, variants, seed=seed)
    sums = summaries(setup, results)
    n_dev, n_tasks = setup.params["devices"], setup.params["tasks"]
    print(f"scale: {n_dev:,} devices, {n_tasks:,} tasks (simulated outcome)")
    print(policy_table(sums))
    rows = [
        [
            label,
            r.wall_s,
            sum(r.plan_wall_s),
            r.events,
            r.end,
            sums[label]["planning_ms"]["p99"],
        ]
        for label, r in results.items()
    ]
    print()
    print("real wall-clock time of each simulation on this machine:")
    print(
        table(
            rows,
            [
                "policy",
                "sim wall s",
                "of which planning s",
                "events",
                "simulated s",
                "plan p99 ms",
            ],
        )
    )
    print(f"(building the cluster and workload: {setup.params['build_s']:.1f} s)")
    files = write_outputs(out, "scale-10k", setup, results, sums, None, plots)
    print(f"wrote {', '.join(str(f) for f in files)}")
    return {"summary": sums, "files": [str(f) for f in files]}
