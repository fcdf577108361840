"""Every scheduling algorithm on random problems (constraints, slots, busy windows, fixed
placements): plans validate, respect the critical path, are deterministic, re-plan without
moving fixed tasks, and refuse unschedulable requests exactly as HEFT does."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.scheduling import (
    Cluster,
    CostModel,
    Objective,
    Placement,
    Plan,
    TaskGraph,
    Unschedulable,
    cost_aware_heft,
    cpop,
    earliest_start,
    heft,
    heft_lookahead,
    iterative_heft,
    least_loaded,
    peft,
    portfolio,
    round_robin,
    weighted_random,
)

from .sched_problems import Problem, closed_subset, critical_path, problems
from .test_sched_money import priced


class Algorithm:
    """Adapts an algorithm (with some keyword options bound) to one call shape."""

    def __init__(self, name: str, fn: Callable[..., Plan], **options: object) -> None:
        self.name, self.fn, self.options = name, fn, options

    def __call__(
        self,
        graph: TaskGraph,
        cluster: Cluster,
        cost: CostModel,
        *,
        fixed: Mapping[str, Placement] | None = None,
        now: float = 0.0,
    ) -> Plan:
        return self.fn(graph, cluster, cost, fixed=fixed, now=now, **self.options)

    def __repr__(self) -> str:
        return self.name


ALGORITHMS = [
    Algorithm("heft", heft),
    Algorithm("cpop", cpop),
    Algorithm("peft", peft),
    Algorithm("heft_lookahead", heft_lookahead),
    Algorithm("iterative_heft", iterative_heft),
    Algorithm("cost_aware_heft", cost_aware_heft, money_weight=500.0),
    Algorithm("portfolio", portfolio),
    Algorithm("portfolio_money", portfolio, objective=Objective(money_weight=100.0)),
    Algorithm("portfolio_budget", portfolio, objective=Objective(budget=0.01)),
    Algorithm("portfolio_prefilter", portfolio, prefilter=3),
    Algorithm("round_robin", round_robin),
    Algorithm("least_loaded", least_loaded),
    Algorithm("weighted_random", weighted_random, seed=3),
    Algorithm("earliest_start", earliest_start),
]
SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _run(
    algo: Algorithm, pb: Problem, fixed: Mapping[str, Placement] | None = None, now: float = 0.0
) -> Plan | None:
    """The plan, or None after checking the refusal is exactly HEFT's."""
    try:
        return algo(pb.graph, pb.cluster, pb.cost, fixed=fixed, now=now)
    except Unschedulable as exc:
        with pytest.raises(Unschedulable) as ref:
            heft(pb.graph, pb.cluster, pb.cost, fixed=fixed, now=now)
        assert exc.reasons == ref.value.reasons
        return None


@pytest.mark.parametrize("algo", ALGORITHMS, ids=repr)
@SETTINGS
@given(pb=problems(), seed=st.integers(0, 2**32 - 1), frac=st.floats(0.0, 1.0))
def test_algorithm_properties(algo: Algorithm, pb: Problem, seed: int, frac: float) -> None:
    pb = priced(pb, seed)
    plan = _run(algo, pb, now=pb.now)
    if plan is None:
        return
    plan.validate(pb.graph, pb.cluster, pb.cost, now=pb.now)
    lower = pb.now + critical_path(pb.graph, pb.cluster, pb.cost)
    assert plan.makespan >= lower - 1e-9 * max(1.0, lower)

    again = algo(pb.graph, pb.cluster, pb.cost, now=pb.now)
    assert again.placements == plan.placements
    assert list(again.placements) == list(plan.placements)
    assert again.algorithm == plan.algorithm

    fixed = {t: plan.placements[t] for t in closed_subset(pb, seed)}
    now = pb.now + frac * (plan.makespan - pb.now)
    replanned = _run(algo, pb, fixed=fixed, now=now)
    assert replanned is not None
    for tid, p in fixed.items():
        assert replanned.placements[tid] == p
    replanned.validate(pb.graph, pb.cluster, pb.cost, fixed=fixed, now=now)


@pytest.mark.parametrize("algo", ALGORITHMS, ids=repr)
def test_fixed_must_be_closed_under_predecessors(algo: Algorithm) -> None:
    from orchestrator.scheduling import Device, LinkCostModel, Task

    graph = TaskGraph([Task("a"), Task("b")], {("a", "b"): 0.0})
    cluster = Cluster([Device("d0", "a0", "s0")])
    fixed = {"b": Placement("b", "d0", 0, 0.0, 1.0)}
    with pytest.raises(ValueError, match="predecessors that are not fixed"):
        algo(graph, cluster, LinkCostModel(), fixed=fixed)


def test_every_algorithm_is_exported_with_heft_signature() -> None:
    import inspect

    base = inspect.signature(heft).parameters
    for fn in (cpop, peft, portfolio, cost_aware_heft, heft_lookahead):
        params = inspect.signature(fn).parameters
        for name in ("graph", "cluster", "cost", "fixed", "now"):
            assert params[name].kind == base[name].kind, (fn, name)
            assert params[name].default == base[name].default, (fn, name)
