"""`failures`: nodes crash and slow down while the pool is under load, every policy.

Setup: `mixed_pool(200)`, Poisson arrivals of CPU/GPU DAGs (20-60 tasks) at about 60% load,
duration noise sigma 0.3, 6 node crashes and 6 slowdowns (speed x 0.25) at random busy
devices across the arrival window; every policy with the same MARS heartbeat detection, so
differences in recovery come from where the lost work is placed again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.scheduling import LinkCostModel
from sim.des import SimConfig
from sim.des_events import Failure, Slowdown, poisson_arrivals
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
from sim.scenarios.workload import cpu_gpu_dag, mixed_pool


def build(seed: int, quick: bool) -> Setup:
    nodes = 50 if quick else 200
    n_pipes = 40 if quick else 300
    rate = 3.0 if quick else 12.0
    incidents = 2 if quick else 6
    cluster, links = mixed_pool(nodes, seed=seed)
    graphs = [
        cpu_gpu_dag(20 + (11 * k + seed) % 41, seed=seed * 20_000 + k) for k in range(n_pipes)
    ]
    arrivals = poisson_arrivals(graphs, rate, seed=seed)
    end = arrivals[-1].at
    failures = [Failure(end * (k + 0.5) / incidents) for k in range(incidents)]
    slowdowns = [Slowdown(end * (k + 0.25) / incidents, 0.25) for k in range(incidents)]
    return Setup(
        cluster=cluster,
        cost=LinkCostModel(links),
        arrivals=arrivals,
        failures=failures,
        slowdowns=slowdowns,
        config=SimConfig(noise_sigma=0.3, seed=seed),
        params={
            "nodes": nodes,
            "devices": len(cluster),
            "pipelines": n_pipes,
            "tasks": sum(len(g) for g in graphs),
            "arrival_rate_per_s": rate,
            "failures_at_s": [f.at for f in failures],
            "slowdowns_at_s": [s.at for s in slowdowns],
            "slowdown_factor": 0.25,
        },
        util_window=(arrivals[0].at, end),
    )


def run(out: Path, seeds: Sequence[int], quick: bool, plots: bool = True) -> dict[str, Any]:
    variants = [Variant(p, p) for p in POLICIES]
    runs = run_seeds(build, variants, seeds, quick, "failures")
    print("failures: crashes and slowdowns under load, heartbeat detection for all (simulated)")
    print(seeds_note(runs))
    print(policy_table(runs, variants))
    print()
    print(
        ratio_line(runs, variants, "portfolio", "mean recovery", lambda s: s["recovery_s"]["mean"])
    )
    print(
        ratio_line(runs, variants, "portfolio", "mean response", lambda s: s["response_s"]["mean"])
    )
    print(
        "recovery = crash -> every task that was running on the dead node runs again "
        "elsewhere; includes detection and the measured re-planning time"
    )
    files = write_outputs(out, "failures", runs, variants, None, plots)
    print(f"\nwrote {', '.join(str(f) for f in files)}")
    return {"runs": runs, "files": [str(f) for f in files]}
