"""Dollars: what a plan costs, how the objective ranks plans, and the cost-aware HEFT."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.scheduling import (
    Cluster,
    Device,
    Link,
    LinkCostModel,
    MatrixCostModel,
    Objective,
    Placement,
    Plan,
    Task,
    TaskGraph,
    Unschedulable,
    cost_aware_heft,
    heft,
    plan_cost,
)

from .sched_problems import Problem, problems


def priced(pb: Problem, seed: int) -> Problem:
    """The same problem with device prices and, for link models, link prices."""
    rng = random.Random(seed)
    devices = [
        dataclasses.replace(d, cost_per_hour=rng.choice([0.0, 0.5, 3.6, 36.0]))
        for d in pb.cluster.devices
    ]
    cost = pb.cost
    if isinstance(cost, LinkCostModel):
        links = {
            k: Link(v.latency_s, v.bandwidth_Bps, rng.choice([0.0, 0.09, 2.0]))
            for k, v in cost.links.items()
        }
        wan = Link(cost.wan.latency_s, cost.wan.bandwidth_Bps, 0.5)
        cost = LinkCostModel(links, lan=cost.lan, wan=wan, local_Bps=cost.local_Bps)
    return Problem(pb.graph, Cluster(devices), cost, pb.now, pb.flavour)


def _two_sites() -> tuple[TaskGraph, Cluster, LinkCostModel]:
    graph = TaskGraph([Task("a", work=3600.0), Task("b", work=1800.0)], {("a", "b"): 2e9})
    cluster = Cluster(
        [
            Device("cheap", "h0", "s0", cost_per_hour=1.0),
            Device("dear", "h1", "s1", cost_per_hour=10.0, speed=2.0),
        ]
    )
    links = {("s0", "s1"): Link(0.0, 1e9, cost_per_gb=0.25), ("s1", "s0"): Link(0.0, 1e9)}
    return graph, cluster, LinkCostModel(links)


def test_plan_cost_counts_device_time_and_cross_site_bytes() -> None:
    graph, cluster, cost = _two_sites()
    plan = Plan(
        {
            "a": Placement("a", "cheap", 0, 0.0, 3600.0),
            "b": Placement("b", "dear", 0, 3602.0, 4502.0),
        }
    )
    plan.validate(graph, cluster, cost)
    # 1 h at $1 + 900 s at $10/h + 2 GB s0 -> s1 at $0.25/GB
    assert plan_cost(plan, graph, cluster, cost) == pytest.approx(1.0 + 2.5 + 0.5)
    reverse = Plan(
        {
            "a": Placement("a", "dear", 0, 0.0, 1800.0),
            "b": Placement("b", "cheap", 0, 1802.0, 3602.0),
        }
    )
    assert plan_cost(reverse, graph, cluster, cost) == pytest.approx(5.0 + 0.5 + 0.0)
    same = Plan(
        {"a": Placement("a", "cheap", 0, 0, 3600.0), "b": Placement("b", "cheap", 0, 3600, 5400)}
    )
    assert plan_cost(same, graph, cluster, cost) == pytest.approx(1.5)


def test_plan_cost_without_link_prices_counts_devices_only() -> None:
    graph, cluster, _ = _two_sites()
    matrix = MatrixCostModel({"a": {"cheap": 3600.0}, "b": {"dear": 900.0}})
    plan = Plan(
        {
            "a": Placement("a", "cheap", 0, 0.0, 3600.0),
            "b": Placement("b", "dear", 0, 2e9 + 3600.0, 2e9 + 4500.0),
        }
    )
    assert plan_cost(plan, graph, cluster, matrix) == pytest.approx(1.0 + 2.5)
    with pytest.raises(ValueError, match="unknown device"):
        plan_cost(Plan({"a": Placement("a", "zz", 0, 0, 1)}), graph, cluster, matrix)


def test_objective_keys() -> None:
    plain = Objective()
    assert not plain.uses_money
    assert plain.key(10.0, 99.0) < plain.key(11.0, 0.0)
    weighted = Objective(time_weight=1.0, money_weight=100.0)
    assert weighted.uses_money
    assert weighted.key(10.0, 0.5) == (60.0, 0.0)
    assert weighted.key(50.0, 0.0) < weighted.key(10.0, 0.5)
    budget = Objective(budget=1.0)
    assert budget.uses_money
    assert budget.key(20.0, 1.0) < budget.key(10.0, 1.01)  # within budget beats faster
    assert budget.key(10.0, 0.9) < budget.key(20.0, 0.1)  # within: faster wins
    assert budget.key(99.0, 2.0) < budget.key(1.0, 3.0)  # none within: cheaper wins
    for bad in ({"time_weight": -1.0}, {"money_weight": math.inf}, {"budget": -0.5}):
        with pytest.raises(ValueError):
            Objective(**bad)


def test_cost_aware_heft_trades_time_for_money() -> None:
    graph, cluster, cost = _two_sites()
    fast = cost_aware_heft(graph, cluster, cost, money_weight=0.0)
    assert fast.placements == heft(graph, cluster, cost).placements
    cheap = cost_aware_heft(graph, cluster, cost, money_weight=1e6)
    cheap.validate(graph, cluster, cost)
    assert {p.device_id for p in cheap.placements.values()} == {"cheap"}
    assert plan_cost(cheap, graph, cluster, cost) < plan_cost(fast, graph, cluster, cost)
    assert cheap.makespan > fast.makespan
    with pytest.raises(ValueError, match="money_weight"):
        cost_aware_heft(graph, cluster, cost, money_weight=-1.0)


def test_cost_aware_heft_avoids_paid_links() -> None:
    """Two equal free devices in different sites; only the link between them is paid."""
    graph = TaskGraph([Task("a"), Task("b", work=1.0)], {("a", "b"): 1e9})
    cluster = Cluster(
        [
            Device("x", "h0", "s0", busy=((1.0, 50.0),)),  # busy after a: b would move
            Device("y", "h1", "s1"),
        ]
    )
    links = {("s0", "s1"): Link(0.0, 1e10, cost_per_gb=5.0)}
    cost = LinkCostModel(links)
    moved = heft(graph, cluster, cost)
    assert moved.placements["b"].device_id == "y"
    stay = cost_aware_heft(graph, cluster, cost, money_weight=100.0)
    stay.validate(graph, cluster, cost)
    assert stay.placements["b"].device_id == "x"
    assert plan_cost(stay, graph, cluster, cost) == 0.0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.integers(0, 2**32 - 1))
def test_cost_aware_with_zero_weight_is_heft(pb: Problem, seed: int) -> None:
    pb = priced(pb, seed)
    try:
        want = heft(pb.graph, pb.cluster, pb.cost, now=pb.now)
    except Unschedulable:
        return
    got = cost_aware_heft(pb.graph, pb.cluster, pb.cost, now=pb.now, money_weight=0.0)
    assert got.placements == want.placements


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.integers(0, 2**32 - 1), st.sampled_from([1.0, 1e2, 1e4, 1e6, 1e9]))
def test_cost_aware_plans_validate_at_any_weight(pb: Problem, seed: int, weight: float) -> None:
    """Large prices added to finish times must not let rounding pass off an overlapping
    (too early) slot as a valid one (a bug the gap search once had)."""
    pb = priced(pb, seed)
    try:
        plan = cost_aware_heft(pb.graph, pb.cluster, pb.cost, now=pb.now, money_weight=weight)
    except Unschedulable:
        return
    plan.validate(pb.graph, pb.cluster, pb.cost, now=pb.now)


@pytest.mark.parametrize("seed", [7, 197, 294, 313])
def test_cost_aware_regression_cases_validate(seed: int) -> None:
    """Problems on which rounding once produced overlapping placements."""
    from .sched_problems import random_problem

    rng = random.Random(seed)
    n, m = rng.randint(1, 14), rng.randint(1, 6)
    pb = random_problem(rng, n, m, rng.choice(["link", "matrix", "plain"]), rng.choice([0.0, 3.5]))
    pb = priced(pb, seed % 7)
    for weight in (1.0, 1e2, 1e4, 1e6, 1e9):
        try:
            plan = cost_aware_heft(pb.graph, pb.cluster, pb.cost, now=pb.now, money_weight=weight)
        except Unschedulable:
            return
        plan.validate(pb.graph, pb.cluster, pb.cost, now=pb.now)
