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
