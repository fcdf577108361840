"""Windows booked on one slot block that slot only (other pipelines' reservations)."""

from __future__ import annotations

import pytest

from orchestrator.scheduling import (
    Cluster,
    Device,
    LinkCostModel,
    Placement,
    Plan,
    PlanError,
    Task,
    TaskGraph,
    heft,
    least_loaded,
    portfolio,
)


def _setup() -> tuple[TaskGraph, Cluster, LinkCostModel]:
    graph = TaskGraph([Task("a", work=2.0), Task("b", work=2.0)], {})
    dev = Device("d", "ag", "s", slots=2, slot_busy=((0, 0.0, 10.0),))
    return graph, Cluster([dev]), LinkCostModel()


@pytest.mark.parametrize("algo", [heft, portfolio, least_loaded])
def test_a_booked_slot_is_avoided_and_the_free_one_used(algo) -> None:
    graph, cluster, cost = _setup()
    plan = algo(graph, cluster, cost)
    plan.validate(graph, cluster, cost)
    starts = sorted((p.slot, p.start) for p in plan.placements.values())
    assert starts == [(1, 0.0), (1, 2.0)]


def test_validate_rejects_overlap_with_a_slot_window_but_not_other_slots() -> None:
    graph, cluster, cost = _setup()
    bad = Plan({"a": Placement("a", "d", 0, 0.0, 2.0), "b": Placement("b", "d", 1, 0.0, 2.0)})
    with pytest.raises(PlanError) as err:
        bad.validate(graph, cluster, cost)
    assert any("overlaps busy window" in v and v.startswith("a:") for v in err.value.violations)
    assert not any(v.startswith("b:") for v in err.value.violations)


def test_slot_window_must_name_an_existing_slot() -> None:
    with pytest.raises(ValueError):
        Device("d", "ag", "s", slots=1, slot_busy=((1, 0.0, 1.0),))


def test_overlaid_cluster_plans_like_a_rebuilt_one_and_leaves_the_base_alone() -> None:
    graph = TaskGraph([Task(f"t{i}", work=1.0 + i) for i in range(6)], {("t0", "t3"): 5.0})
    base = Cluster(
        [Device(f"d{i}", f"a{i}", f"s{i % 2}", slots=2, speed=1.0 + i) for i in range(4)]
    )
    extra = {1: ((0, 0.0, 4.0), (1, 1.0, 3.0)), 3: ((1, 0.5, 9.0),)}
    overlaid = base.with_slot_busy(extra)
    rebuilt = Cluster(
        [
            Device(d.id, d.agent_id, d.site, slots=2, speed=d.speed, slot_busy=extra.get(i, ()))
            for i, d in enumerate(base.devices)
        ]
    )
    cost = LinkCostModel()
    assert heft(graph, overlaid, cost).placements == heft(graph, rebuilt, cost).placements
    assert [d.slot_busy for d in overlaid] == [d.slot_busy for d in rebuilt]
    assert all(d.slot_busy == () for d in base)  # the cached snapshot is never changed
    assert overlaid.speed is base.speed and overlaid.index is base.index
