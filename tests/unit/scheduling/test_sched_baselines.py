"""Baseline schedulers: valid plans on random problems, and the rule each one follows."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.scheduling import (
    Cluster,
    CostModel,
    Device,
    Link,
    LinkCostModel,
    MatrixCostModel,
    Placement,
    Plan,
    Task,
    TaskGraph,
    Unschedulable,
)
from orchestrator.scheduling.baselines import (
    earliest_start,
    least_loaded,
    round_robin,
    weighted_random,
)

from .sched_problems import Problem, closed_subset, problems, usable

Baseline = Callable[..., Plan]
BASELINES: dict[str, Baseline] = {
    "round-robin": round_robin,
    "least-loaded": least_loaded,
    "weighted-random": weighted_random,
    "earliest-start": earliest_start,
}
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
COST = LinkCostModel()


def _run(
    name: str,
    pb: Problem,
    seed: int,
    fixed: Mapping[str, Placement] | None = None,
    now: float | None = None,
) -> Plan | None:
    """The plan, or None after checking that Unschedulable names exactly the hopeless tasks."""
    try:
        return BASELINES[name](
            pb.graph,
            pb.cluster,
            pb.cost,
            fixed=fixed,
            now=pb.now if now is None else now,
            seed=seed,
        )
    except Unschedulable as exc:
        hopeless = {
            t.id for t in pb.graph if not any(usable(t, d, pb.cost) for d in pb.cluster)
        } - set(fixed or {})
        assert set(exc.reasons) == hopeless
        for by_dev in exc.reasons.values():
            assert set(by_dev) == set(pb.cluster.ids)
        return None


@SETTINGS
@given(problems(), st.sampled_from(sorted(BASELINES)), st.integers(0, 2**32 - 1))
def test_plans_validate_and_are_deterministic(pb: Problem, name: str, seed: int) -> None:
    plan = _run(name, pb, seed)
    if plan is None:
        return
    assert plan.algorithm == name
    plan.validate(pb.graph, pb.cluster, pb.cost, now=pb.now)
    again = _run(name, pb, seed)
    assert again is not None
    assert again.placements == plan.placements
    assert list(again.placements) == list(plan.placements)


@SETTINGS
@given(
    problems(),
    st.sampled_from(sorted(BASELINES)),
    st.integers(0, 2**32 - 1),
    st.floats(0.0, 1.0),
)
def test_replanning_keeps_fixed_placements(pb: Problem, name: str, seed: int, frac: float) -> None:
    first = _run(name, pb, seed)
    if first is None:
        return
    fixed = {t: first.placements[t] for t in closed_subset(pb, seed)}
    now = pb.now + frac * (first.makespan - pb.now) + 0.5
    again = _run(name, pb, seed + 1, fixed=fixed, now=now)
    assert again is not None
    for tid, p in fixed.items():
        assert again.placements[tid] == p
    again.validate(pb.graph, pb.cluster, pb.cost, fixed=fixed, now=now)


# --- round robin -------------------------------------------------------------------------


def test_round_robin_cycles_and_skips_ineligible_devices() -> None:
    cluster = Cluster(
        [Device("d0", "a0", "s0"), Device("d1", "a1", "s0", kind="gpu"), Device("d2", "a2", "s0")]
    )
    tasks = [Task(f"t{i}") for i in range(5)] + [Task("g", kinds=frozenset({"gpu"})), Task("t5")]
    plan = round_robin(TaskGraph(tasks, {}), cluster, COST)
    where = {t: p.device_id for t, p in plan.placements.items()}
    assert [where[f"t{i}"] for i in range(5)] == ["d0", "d1", "d2", "d0", "d1"]
    assert where["g"] == "d1"  # the only gpu, reached by skipping d2 and d0
    assert where["t5"] == "d2"  # the cycle continues after g's device
    assert plan.algorithm == "round-robin"


def test_round_robin_appends_behind_its_own_queue_but_goes_around_busy_windows() -> None:
    cluster = Cluster([Device("d0", "a0", "s0", busy=((2.0, 3.0),))])
    graph = TaskGraph([Task("a", work=1.0), Task("b", work=2.0), Task("c", work=0.5)], {})
    plan = round_robin(graph, cluster, COST, now=0.5)
    got = {t: (p.start, p.finish) for t, p in plan.placements.items()}
    assert got == {"a": (0.5, 1.5), "b": (3.0, 5.0), "c": (5.0, 5.5)}  # c is not inserted
    plan.validate(graph, cluster, COST, now=0.5)


# --- least loaded ------------------------------------------------------------------------


def test_least_loaded_balances_booked_work_per_slot() -> None:
    cluster = Cluster(
        [Device("d0", "a0", "s0", slots=2), Device("d1", "a1", "s0"), Device("d2", "a2", "s0")]
    )
    works = [4.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    graph = TaskGraph([Task(f"t{i}", work=w) for i, w in enumerate(works)], {})
    plan = least_loaded(graph, cluster, COST)
    where = [plan.placements[f"t{i}"].device_id for i in range(len(works))]
    # loads per slot: d0 4/2=2 after t0; t1->d1, t2->d2, t3->d1 (tie 1,1 -> lower), t4->d2,
    # t5: d0 2, d1 2, d2 2 -> d0
    assert where == ["d0", "d1", "d2", "d1", "d2", "d0"]
    assert plan.placements["t5"].slot == 1  # slot 0 is busy with t0
    assert plan.algorithm == "least-loaded"


def test_least_loaded_ignores_communication_but_times_include_it() -> None:
    slow = LinkCostModel({("s0", "s1"): Link(5.0, 1e6)})
    cluster = Cluster([Device("d0", "a0", "s0"), Device("d1", "a1", "s1")])
    graph = TaskGraph([Task("a"), Task("b")], {("a", "b"): 1e6})
    plan = least_loaded(graph, cluster, slow)
    assert plan.placements["b"].device_id == "d1"  # the idle device, despite the slow link
    assert plan.placements["b"].start == pytest.approx(1.0 + 5.0 + 1.0)
    plan.validate(graph, cluster, slow)


def test_least_loaded_counts_fixed_work_still_running() -> None:
    cluster = Cluster([Device("d0", "a0", "s0"), Device("d1", "a1", "s0")])
    graph = TaskGraph([Task("run", work=10.0), Task("x")], {})
    fixed = {"run": Placement("run", "d1", 0, 0.0, 10.0)}
    plan = least_loaded(graph, cluster, COST, fixed=fixed, now=1.0)
    assert plan.placements["x"].device_id == "d0"
    assert plan.placements["run"] == fixed["run"]


# --- weighted random ---------------------------------------------------------------------


def test_weighted_random_is_seeded_and_avoids_loaded_devices() -> None:
    cluster = Cluster([Device(f"d{i}", f"a{i}", "s0") for i in range(3)])
    graph = TaskGraph([Task(f"t{i}", work=1.0) for i in range(30)], {})
    plans = [weighted_random(graph, cluster, COST, seed=s) for s in range(5)]
    again = weighted_random(graph, cluster, COST, seed=3)
    assert again.placements == plans[3].placements
    assigned = [[p.placements[f"t{i}"].device_id for i in range(30)] for p in plans]
    assert len({tuple(a) for a in assigned}) > 1  # different seeds, different shards
    for a in assigned:
        assert set(a) == {"d0", "d1", "d2"}  # load feedback spreads the work
    assert all(p.algorithm == "weighted-random" for p in plans)


def test_weighted_random_steers_clear_of_a_device_busy_with_fixed_work() -> None:
    cluster = Cluster([Device("d0", "a0", "s0"), Device("d1", "a1", "s0")])
    graph = TaskGraph([Task("run", work=100.0), Task("x")], {})
    fixed = {"run": Placement("run", "d0", 0, 0.0, 100.0)}
    # weights 1/100.1 vs 1/0.1: d0 has a ~0.1% chance
    picks = [
        weighted_random(graph, cluster, COST, fixed=fixed, seed=s).placements["x"].device_id
        for s in range(20)
    ]
    assert picks == ["d1"] * 20


# --- earliest start ----------------------------------------------------------------------


def test_earliest_start_prefers_the_device_free_first_even_if_slower() -> None:
    cluster = Cluster(
        [Device("fast", "a0", "s0", speed=10.0, busy=((0.0, 5.0),)), Device("slow", "a1", "s0")]
    )
    graph = TaskGraph([Task("t", work=10.0)], {})
    plan = earliest_start(graph, cluster, COST)
    assert plan.placements["t"] == Placement("t", "slow", 0, 0.0, 10.0)  # fast would end at 6
    assert plan.algorithm == "earliest-start"


def test_earliest_start_counts_data_arrival() -> None:
    cost = MatrixCostModel({"a": {"d0": 1.0}, "b": {"d0": 1.0, "d1": 1.0}, "c": {"d0": 3.0}})
    cluster = Cluster([Device("d0", "a0", "s0"), Device("d1", "a1", "s1")])
    graph = TaskGraph([Task("a"), Task("c"), Task("b")], {("a", "b"): 2.0})
    plan = earliest_start(graph, cluster, cost)
    # a on d0 [0,1), c on d0 [1,4); b: d0 at 4, d1 at 1 + 2 = 3
    assert plan.placements["b"] == Placement("b", "d1", 0, 3.0, 4.0)
    plan.validate(graph, cluster, cost)


def test_earliest_start_ties_go_to_the_faster_device_then_lower_index() -> None:
    cluster = Cluster(
        [
            Device("d0", "a0", "s0"),
            Device("d1", "a1", "s0", speed=2.0),
            Device("d2", "a2", "s0", speed=2.0),
        ]
    )
    graph = TaskGraph([Task("x", work=2.0)], {})
    assert earliest_start(graph, cluster, COST).placements["x"].device_id == "d1"


# --- shared behaviour --------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_unschedulable_lists_every_device(name: str) -> None:
    cluster = Cluster([Device("d0", "a0", "s0"), Device("d1", "a1", "s0", tier="cloud")])
    graph = TaskGraph([Task("ok"), Task("gpu", kinds=frozenset({"gpu"}))], {})
    with pytest.raises(Unschedulable) as info:
        BASELINES[name](graph, cluster, COST)
    assert set(info.value.reasons) == {"gpu"}
    assert set(info.value.reasons["gpu"]) == {"d0", "d1"}


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_constraints_now_and_fixed_are_respected(name: str) -> None:
    cluster = Cluster(
        [
            Device("e0", "a0", "edge", slots=2, busy=((3.0, 4.0),)),
            Device("g0", "a1", "edge", kind="gpu"),
            Device("c0", "a2", "cloud", tier="cloud", speed=4.0),
        ]
    )
    tasks = [
        Task("src", work=2.0, tiers=frozenset({"edge"})),
        Task("det", work=4.0, kinds=frozenset({"gpu"})),
        Task("agg", work=1.0, tiers=frozenset({"cloud"})),
        Task("side", work=1.0),
    ]
    graph = TaskGraph(tasks, {("src", "det"): 1e6, ("det", "agg"): 1e3, ("src", "side"): 0.0})
    fixed = {"src": Placement("src", "e0", 1, 0.0, 2.0)}
    cost: CostModel = COST
    plan = BASELINES[name](graph, cluster, cost, fixed=fixed, now=1.0, seed=7)
    plan.validate(graph, cluster, cost, fixed=fixed, now=1.0)
    assert plan.placements["src"] == fixed["src"]
    assert plan.placements["det"].device_id == "g0"
    assert plan.placements["agg"].device_id == "c0"
    assert next(iter(plan.placements)) == "src"


def _independent(n_tasks: int, n_devices: int) -> tuple[TaskGraph, Cluster, MatrixCostModel]:
    tasks = [Task(f"t{i}") for i in range(n_tasks)]
    devs = [Device(f"d{j}", f"a{j}", "s") for j in range(n_devices)]
    cost = MatrixCostModel({t.id: {d.id: 1.0 for d in devs} for t in tasks})
    return TaskGraph(tasks, {}), Cluster(devs), cost


def test_state_carried_across_calls_steers_the_baselines() -> None:
    """What a cluster scheduler keeps between pipelines: the cursor, other pipelines' load,
    one random stream."""
    import numpy as np

    graph, cluster, cost = _independent(1, 4)
    assert round_robin(graph, cluster, cost, cursor=2).placements["t0"].device_id == "d2"
    assert round_robin(graph, cluster, cost, cursor=6).placements["t0"].device_id == "d2"
    busy = np.array([5.0, 0.0, 3.0, 1.0])
    assert least_loaded(graph, cluster, cost, load=busy).placements["t0"].device_id == "d1"
    assert least_loaded(graph, cluster, cost).placements["t0"].device_id == "d0"
    # with all but one device heavily loaded, the draw lands on the idle one
    heavy = np.array([1e9, 1e9, 0.0, 1e9])
    picked = weighted_random(graph, cluster, cost, load=heavy, seed=1).placements["t0"]
    assert picked.device_id == "d2"
    graph, cluster, cost = _independent(8, 4)
    shared = np.random.default_rng(3)
    first = weighted_random(graph, cluster, cost, rng=shared)
    second = weighted_random(graph, cluster, cost, rng=shared)  # the stream goes on
    fresh = weighted_random(graph, cluster, cost, seed=3)
    assert first.placements == fresh.placements
    assert second.placements != first.placements
