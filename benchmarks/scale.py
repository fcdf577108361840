"""Planning time at scale.

    python -m benchmarks.scale [--repeat 5]

1. A 1,000-task DAG on 1,000 devices (edge/fog/cloud tiers, link model): HEFT and portfolio
   planning time (goal for HEFT: <= 250 ms).
2. A 100-task pipeline over 10,000 devices: portfolio with candidate pre-filtering against the
   same portfolio unfiltered — time and makespan of both (goal: <= 50 ms, <= 2% makespan lost).
3. `--graphs 18`: that many comm-heavy 100-task random DAGs (CCR 1-5 in turn against the WAN,
   one seed each) on two 10,000-device clusters: the tiered one, and a flat one of 200 sites
   x 50 devices (speeds 0.75-1.25, 3.125 MB/s WAN between sites), where the fastest devices
   are scattered one per site. Per graph the pre-filtered planning time, the loss against the
   unfiltered plan and how many sites each plan spreads over; then the worst and the count
   over 2% (goal: <= 50 ms and <= 2% on every graph).
"""

from __future__ import annotations

import argparse
from functools import partial

from benchmarks.common import median, progress, samples, table
from orchestrator.scheduling import LinkCostModel, heft, portfolio
from orchestrator.scheduling.model import Cluster
from orchestrator.scheduling.plan import Plan
from sim.workloads import random_cluster, random_dag, tiered_cluster, video_analytics


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--prefilter", type=int, default=64, help="candidate devices kept")
    ap.add_argument("--graphs", type=int, default=18, help="comm-heavy graphs in part 3")
    ap.add_argument("--only-graphs", action="store_true", help="run part 3 alone")
    args = ap.parse_args(argv)
    if not args.only_graphs:
        _fixed_instances(args)
    if args.graphs > 0:
        _comm_heavy(args)
    return 0


def _sites(plan: Plan, cluster: Cluster) -> int:
    site = {d.id: d.site for d in cluster.devices}
    return len({site[p.device_id] for p in plan.placements.values()})


def _comm_heavy(args: argparse.Namespace) -> None:
    progress(f"building 10,000 devices twice; {args.graphs} comm-heavy graphs on each")
    tiered, tiered_links = tiered_cluster(10_000, seed=11)
    flat_cost = LinkCostModel()
    for name, big, cost, bw in (
        ("tiered", tiered, LinkCostModel(tiered_links), 12.5e6),
        ("flat 200 sites", random_cluster(10_000, seed=11, sites=200), flat_cost, 25e6 / 8),
    ):
        _graphs(args, name, big, cost, bw)


def _graphs(
    args: argparse.Namespace, name: str, big: Cluster, cost: LinkCostModel, bw: float
) -> None:
    portfolio(random_dag(20, ccr=1.0, seed=0, bandwidth_Bps=bw), big, cost, prefilter=8)
    rows, losses, times = [], [], []
    for n in range(args.graphs):
        ccr = float(1 + n % 5)
        graph = random_dag(100, ccr=ccr, seed=100 + n, bandwidth_Bps=bw)
        f, tf = samples(partial(portfolio, graph, big, cost, prefilter=args.prefilter), args.repeat)
        u = portfolio(graph, big, cost)
        f.validate(graph, big, cost)
        loss = f.makespan / u.makespan - 1.0
        losses.append(loss)
        times.append(median(tf))
        rows.append(
            [
                f"seed {100 + n}, CCR {ccr:g}",
                median(tf) * 1e3,
                f.makespan,
                u.makespan,
                f"{100 * loss:+.2f}%",
                _sites(f, big),
                _sites(u, big),
            ]
        )
    print(
        table(
            rows,
            [
                f"100-task DAG x 10,000 devices ({name})",
                "prefiltered ms",
                "prefiltered makespan",
                "unfiltered makespan",
                "loss",
                "sites (prefiltered)",
                "sites (unfiltered)",
            ],
        )
    )
    over = sum(x > 0.02 for x in losses)
    print(
        f"{name}, k={args.prefilter}: worst loss {100 * max(losses):+.2f}%,"
        f" {over} of {len(losses)} over +2%; prefiltered ms median {median(times) * 1e3:.1f},"
        f" max {max(times) * 1e3:.1f}"
        " (goal: <= 50 ms, <= +2% on every graph)\n"
    )


def _fixed_instances(args: argparse.Namespace) -> None:

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
    print(f"goal: <= 50 ms with pre-filtering (k={args.prefilter}), <= +2% makespan\n")


if __name__ == "__main__":
    raise SystemExit(main())
