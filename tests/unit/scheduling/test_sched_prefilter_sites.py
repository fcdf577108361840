"""Pre-filtering by site: a comm-heavy graph keeps the fastest devices with their site-mates,
not the cluster's fastest devices scattered one per site (issue 45)."""

from __future__ import annotations

import pytest

from orchestrator.scheduling import Cluster, Device, LinkCostModel, Task, TaskGraph, heft
from orchestrator.scheduling.prefilter import SITE_DEVICES, prefilter_indices
from sim.workloads import random_cluster, random_dag


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_comm_heavy_plan_on_the_kept_devices_loses_little(seed: int) -> None:
    """50 sites of 20 devices behind a 25 Mbit/s WAN, a 40-task DAG at CCR 3 against it: the
    32 fastest devices sit on ~25 sites, and planning on them alone lost 16-26%."""
    cost = LinkCostModel()
    cluster = random_cluster(1000, seed=11, sites=50)
    graph = random_dag(40, ccr=3.0, seed=seed, bandwidth_Bps=cost.wan.bandwidth_Bps)
    kept = prefilter_indices(graph, cluster, cost, 4 * SITE_DEVICES).tolist()
    small = Cluster([cluster.devices[d] for d in kept])
    assert heft(graph, small, cost).makespan <= 1.02 * heft(graph, cluster, cost).makespan


def test_a_site_holding_the_fastest_devices_keeps_all_of_them() -> None:
    """A data centre with the k fastest devices keeps them all, not just SITE_DEVICES."""
    tasks = [Task(f"t{i}", work=10.0) for i in range(12)]
    edges = {("t0", f"t{i}"): 50e6 for i in range(1, 12)}
    dc = [Device(f"dc{i}", f"a-dc{i}", "dc", speed=5.0 - i / 100) for i in range(40)]
    edge = [Device(f"e{i}", f"a-e{i}", f"e{i % 20}", speed=1.0) for i in range(40)]
    cluster = Cluster([*edge, *dc])
    kept = prefilter_indices(TaskGraph(tasks, edges), cluster, LinkCostModel(), 2 * SITE_DEVICES)
    assert [cluster.devices[d].id for d in kept.tolist()] == [f"dc{i}" for i in range(16)]
