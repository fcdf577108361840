"""HEFT on random problems: plans validate, respect the critical path, keep fixed placements."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from orchestrator.scheduling import Placement, Plan, Unschedulable, heft
from orchestrator.scheduling.engine import Prepared

from .sched_problems import (
    PlainCostModel,
    Problem,
    closed_subset,
    critical_path,
    problems,
    usable,
)

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _needs_compiled_loop() -> None:
    """Skip unless the compiled loop can run here: numba installed and not turned off."""
    pytest.importorskip("numba")
    if os.environ.get("MARS_JIT", "1") == "0":
        pytest.skip("MARS_JIT=0 turns the compiled loop off")


def _plan_or_unschedulable(pb: Problem, insertion: bool = True) -> Plan | None:
    try:
        return heft(pb.graph, pb.cluster, pb.cost, now=pb.now, insertion=insertion)
    except Unschedulable as exc:
        for tid, by_dev in exc.reasons.items():
            task = pb.graph.task(tid)
            assert not any(usable(task, d, pb.cost) for d in pb.cluster)
            assert set(by_dev) == set(pb.cluster.ids)
        return None


@SETTINGS
@given(problems(), st.booleans())
def test_heft_plan_validates_and_beats_nothing_below_critical_path(
    pb: Problem, insertion: bool
) -> None:
    plan = _plan_or_unschedulable(pb, insertion)
    if plan is None:
        return
    plan.validate(pb.graph, pb.cluster, pb.cost, now=pb.now)
    lower = pb.now + critical_path(pb.graph, pb.cluster, pb.cost)
    assert plan.makespan >= lower - 1e-9 * max(1.0, lower)


@SETTINGS
@given(problems())
def test_heft_is_deterministic(pb: Problem) -> None:
    first = _plan_or_unschedulable(pb)
    if first is None:
        return
    again = heft(pb.graph, pb.cluster, pb.cost, now=pb.now)
    assert again.placements == first.placements
    assert list(again.placements) == list(first.placements)


@SETTINGS
@given(problems(), st.integers(0, 2**32 - 1), st.floats(0.0, 1.0))
def test_replanning_keeps_fixed_placements(pb: Problem, seed: int, frac: float) -> None:
    first = _plan_or_unschedulable(pb)
    if first is None:
        return
    fixed: dict[str, Placement] = {t: first.placements[t] for t in closed_subset(pb, seed)}
    now = pb.now + frac * (first.makespan - pb.now)
    again = heft(pb.graph, pb.cluster, pb.cost, fixed=fixed, now=now)
    for tid, p in fixed.items():
        assert again.placements[tid] == p
    again.validate(pb.graph, pb.cluster, pb.cost, fixed=fixed, now=now)


def test_fixed_must_be_closed_under_predecessors() -> None:
    from orchestrator.scheduling import Cluster, Device, LinkCostModel, Task, TaskGraph

    graph = TaskGraph([Task("a"), Task("b")], {("a", "b"): 0.0})
    cluster = Cluster([Device("d0", "a0", "s0")])
    fixed = {"b": Placement("b", "d0", 0, 0.0, 1.0)}
    with pytest.raises(ValueError, match="predecessors that are not fixed"):
        heft(graph, cluster, LinkCostModel(), fixed=fixed)
    with pytest.raises(ValueError, match="unknown device"):
        heft(graph, cluster, LinkCostModel(), fixed={"a": Placement("a", "zz", 0, 0.0, 1.0)})


def _replan_request(pb: Problem, seed: int, frac: float) -> Prepared | None:
    """A re-planning request: HEFT's plan with a random closed subset of it fixed, `now` at
    `frac` of its makespan (None when the problem is unschedulable)."""
    first = _plan_or_unschedulable(pb)
    if first is None:
        return None
    fixed = {t: first.placements[t] for t in closed_subset(pb, seed)}
    return Prepared(pb.graph, pb.cluster, pb.cost, fixed, pb.now + frac * (first.makespan - pb.now))


@SETTINGS
@given(problems(), st.booleans(), st.integers(0, 2**32 - 1), st.floats(0.0, 1.0))
def test_list_loop_matches_numpy_loop(pb: Problem, insertion: bool, seed: int, frac: float) -> None:
    """The plain-float loop for small clusters makes exactly the numpy loop's decisions."""
    from orchestrator.scheduling.engine import ListScheduler
    from orchestrator.scheduling.ranks import priority_keys

    prep = _replan_request(pb, seed, frac)
    if prep is None:
        return
    fixed, now = prep.fixed, prep.now
    assume(prep.table.dense_lists() is not None)  # a cost model with matrices: the small path
    keys = priority_keys(prep.upward())
    by_lists = ListScheduler(prep, insertion, lists="python").run(keys, None, "heft")
    by_numpy = ListScheduler(prep, insertion, lists=False).run(keys, None, "heft")
    assert by_lists.placements == by_numpy.placements
    by_lists.validate(pb.graph, pb.cluster, pb.cost, fixed=fixed, now=now)


@SETTINGS
@given(problems(), st.booleans(), st.integers(0, 2**32 - 1), st.floats(0.0, 1.0))
def test_compiled_loop_matches_list_loop(
    pb: Problem, insertion: bool, seed: int, frac: float
) -> None:
    """The numba loop makes exactly the plain-float loop's decisions, fixed tasks and busy
    windows included (numba is in the test extra, so this runs in CI)."""
    _needs_compiled_loop()
    from orchestrator.scheduling import compiled
    from orchestrator.scheduling.engine import ListScheduler
    from orchestrator.scheduling.ranks import priority_keys

    assert compiled.runner() is not None
    prep = _replan_request(pb, seed, frac)
    if prep is None:
        return
    dense = prep.table.dense()
    assume(prep.table.dense_lists() is not None)
    assert dense is not None
    keys = priority_keys(prep.upward())
    by_lists = ListScheduler(prep, insertion, lists="python").run(keys, None, "heft")
    by_kernel = compiled.run_compiled(ListScheduler(prep, insertion), keys, "heft", dense)
    assert by_kernel.placements == by_lists.placements
    assert list(by_kernel.placements) == list(by_lists.placements)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_tasks=40, max_devices=120), st.booleans(), st.integers(0, 2**32 - 1))
def test_compiled_loop_matches_numpy_loop_on_larger_clusters(
    pb: Problem, insertion: bool, seed: int
) -> None:
    """Above 32 devices the compiled loop replaces the numpy one (up to 256 devices)."""
    _needs_compiled_loop()
    from orchestrator.scheduling import compiled
    from orchestrator.scheduling.engine import ListScheduler
    from orchestrator.scheduling.ranks import priority_keys

    prep = _replan_request(pb, seed, 0.0)
    if prep is None:
        return
    fixed = prep.fixed
    dense = prep.table.dense()
    assume(dense is not None)
    assert dense is not None
    keys = priority_keys(prep.upward())
    by_numpy = ListScheduler(prep, insertion, lists=False).run(keys, None, "heft")
    by_kernel = compiled.run_compiled(ListScheduler(prep, insertion), keys, "heft", dense)
    assert by_kernel.placements == by_numpy.placements
    by_kernel.validate(pb.graph, pb.cluster, pb.cost, fixed=fixed, now=pb.now)


def test_requests_too_large_for_the_compiled_loop_plan_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over `compiled.MAX_CELLS` the Python loops plan, and plan the same."""
    _needs_compiled_loop()
    from orchestrator.scheduling import LinkCostModel, compiled
    from sim.workloads import random_cluster, random_dag

    graph = random_dag(60, ccr=1.0, alpha=1.0, seed=3)
    cluster = random_cluster(8, beta=1.0, seed=3)
    cost = LinkCostModel()
    calls: list[int] = []
    real = compiled.run_compiled

    def counting(*a: object, **kw: object) -> Plan:
        calls.append(1)
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(compiled, "run_compiled", counting)
    fixed = {"t0": heft(graph, cluster, cost).placements["t0"]}  # general path, not direct
    fast = heft(graph, cluster, cost, fixed=fixed)
    assert calls == [1]
    monkeypatch.setattr(compiled, "MAX_CELLS", 10)
    assert compiled.heft_direct(graph, cluster, cost, 0.0, True) is None
    slow = heft(graph, cluster, cost, fixed=fixed)
    assert calls == [1]  # not called again
    assert slow.placements == fast.placements


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_tasks=30, max_devices=40, busy=False, constrained=None), st.booleans())
def test_direct_heft_matches_the_general_path(pb: Problem, insertion: bool) -> None:
    """`compiled.heft_direct` (ranks, keys and loop compiled, no set-up objects) makes the
    plan of the general path: upward ranks and keys in Python, the Python or numpy loop."""
    _needs_compiled_loop()
    from orchestrator.scheduling import compiled
    from orchestrator.scheduling.engine import ListScheduler
    from orchestrator.scheduling.ranks import priority_keys

    try:
        prep = Prepared(pb.graph, pb.cluster, pb.cost, None, pb.now)
    except Unschedulable:
        assert compiled.heft_direct(pb.graph, pb.cluster, pb.cost, pb.now, insertion) is None
        return
    keys = priority_keys(prep.upward())
    loop = "python" if prep.table.dense_lists() is not None else False
    general = ListScheduler(prep, insertion, lists=loop).run(keys, None, "heft")
    direct = compiled.heft_direct(pb.graph, pb.cluster, pb.cost, pb.now, insertion)
    batch = not isinstance(pb.cost, PlainCostModel)
    everywhere = bool(np.isfinite(prep.w).all())  # every task may run on every device
    assert (direct is not None) == (batch and everywhere)
    if direct is not None:
        assert direct.placements == general.placements
        assert list(direct.placements) == list(general.placements)
        assert direct.algorithm == ("heft" if insertion else "heft-noins")
        direct.validate(pb.graph, pb.cluster, pb.cost, now=pb.now)
