"""`scale-10k`: 10,000 devices and 10,000 tasks (100 pipelines x 100 tasks) simulated.

Setup: `tiered_cluster(10000)` (~54,000 slots), 100 random DAGs of 100 tasks (CCR 1 against
a 35 Mbit/s WAN), Poisson arrivals, noise sigma 0.2, two node failures and two slowdowns.
Policies: portfolio and HEFT (each on ~64 pre-filtered candidate devices), kube-like (scores
the share of feasible devices kube-scheduler's default would: 5% of 10,000, 42% of 1,000),
least-loaded and round-robin (on all of them). Reports the simulated outcome and the real
wall-clock time of each run.
`--quick`: 1,000 devices and 1,000 tasks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.scheduling import LinkCostModel
from sim.des import SimConfig
from sim.des_events import Failure, Slowdown, poisson_arrivals
from sim.report import (
    Setup,
    Variant,
    ci95,
    policy_table,
    run_seeds,
    seeds_note,
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


POLICIES = ("portfolio", "heft", "kube-like", "least-loaded", "round-robin")


def run(out: Path, seeds: Sequence[int], quick: bool, plots: bool = True) -> dict[str, Any]:
    variants = [Variant(p, p) for p in POLICIES]
    runs = run_seeds(build, variants, seeds, quick, "scale-10k")
    params = runs[0].setup.params
    n_dev, n_tasks = params["devices"], params["tasks"]
    print(f"scale: {n_dev:,} devices, {n_tasks:,} tasks (simulated outcome)")
    print(seeds_note(runs))
    print(policy_table(runs, variants))
    rows = [
        [
            v.label,
            ci95([r.results[v.label].wall_s for r in runs]).cell(),
            ci95([sum(r.results[v.label].plan_wall_s) for r in runs]).cell(),
            ci95([float(r.results[v.label].events) for r in runs]).cell(),
            ci95([r.results[v.label].end for r in runs]).cell(),
        ]
        for v in variants
    ]
    print()
    print("real wall-clock time of each simulation on this machine (mean ± 95% CI):")
    print(table(rows, ["policy", "sim wall s", "of which planning s", "events", "simulated s"]))
    build_s = ci95([r.setup.params["build_s"] for r in runs])
    print(f"(building the cluster and workload: {build_s.cell()} s)")
    files = write_outputs(out, "scale-10k", runs, variants, None, plots)
    print(f"wrote {', '.join(str(f) for f in files)}")
    return {"runs": runs, "files": [str(f) for f in files]}
