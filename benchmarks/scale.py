"""Planning time at scale.

    python -m benchmarks.scale [--repeat 5]

1. A 1,000-task DAG on 1,000 devices (edge/fog/cloud tiers, link model): HEFT and portfolio
   planning time (goal for HEFT: <= 250 ms).
2. A 100-task pipeline over 10,000 devices: portfolio with candidate pre-filtering against the
   same portfolio unfiltered — time and makespan of both (goal: <= 50 ms, <= 2% makespan lost).
"""

from __future__ import annotations

import argparse
from functools import partial

from benchmarks.common import median, progress, samples, table
from orchestrator.scheduling import LinkCostModel, heft, portfolio
from sim.workloads import random_dag, tiered_cluster, video_analytics


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--prefilter", type=int, default=64, help="candidate devices kept")
    args = ap.parse_args(argv)

    progress("building 1,000 devices and a 1,000-task DAG")
    cluster, links = tiered_cluster(1000, seed=7)
    cost = LinkCostModel(links)
    rows = []
    for ccr in (0.1, 1.0, 5.0):
        graph = random_dag(1000, ccr=ccr, seed=7, bandwidth_Bps=12.5e6)
        h, th = samples(partial(heft, graph, cluster, cost), args.repeat)
        p, tp = samples(partial(portfolio, graph, cluster, cost), args.repeat)
        h.validate(graph, cluster, cost)
        p.validate(graph, cluster, cost)
        rows.append(
            [
                f"1000 tasks x 1000 devices, CCR {ccr}",
                median(th) * 1e3,
                min(th) * 1e3,
                median(tp) * 1e3,
                h.makespan,
                p.makespan,
                p.algorithm,
            ]
        )
    print(
        table(
            rows,
            [
                "instance",
                "heft ms (median)",
                "heft ms (best)",
                "portfolio ms",
                "heft makespan",
                "portfolio makespan",
                "winner",
            ],
        )
    )
    print("goal: HEFT <= 250 ms for 1,000 tasks on 1,000 devices\n")

    progress("building 10,000 devices")
    big, big_links = tiered_cluster(10_000, seed=11)
    big_cost = LinkCostModel(big_links)
    rows = []
    for name, graph in (
        ("random DAG v=100 CCR 1", random_dag(100, ccr=1.0, seed=3, bandwidth_Bps=12.5e6)),
        ("video analytics 33 streams", video_analytics(streams=33)),
    ):
        f, tf = samples(
            partial(portfolio, graph, big, big_cost, prefilter=args.prefilter), args.repeat
        )
        u, tu = samples(partial(portfolio, graph, big, big_cost), max(1, args.repeat // 2))
        f.validate(graph, big, big_cost)
        loss = f.makespan / u.makespan - 1.0
        rows.append(
            [
                f"{name} ({len(graph)} tasks) x 10,000 devices",
                median(tf) * 1e3,
                f.makespan,
                median(tu) * 1e3,
                u.makespan,
                f"{100 * loss:+.2f}%",
            ]
        )
    print(
        table(
            rows,
            [
                "instance",
                "prefiltered ms",
                "prefiltered makespan",
                "unfiltered ms",
                "unfiltered makespan",
                "makespan change",
            ],
        )
    )
    print(f"goal: <= 50 ms with pre-filtering (k={args.prefilter}), <= +2% makespan")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
