"""Tie-break variants of HEFT: which of equal-rank tasks goes first, which of equal devices
gets the task. Each is a different plan where ties decide, and the same plan where none do."""

from __future__ import annotations

import pytest

from orchestrator.scheduling import Cluster, Device, LinkCostModel, Task, TaskGraph
from orchestrator.scheduling.engine import Prepared
from orchestrator.scheduling.heft import heft_prepared
from orchestrator.scheduling.portfolio import TIME_CANDIDATES, devices_reversed


def _fork(works: tuple[float, ...]) -> Prepared:
    """A source feeding one child per entry of `works`, on one device: all queue there."""
    tasks = [Task("src", work=1.0)] + [Task(f"c{i}", work=w) for i, w in enumerate(works)]
    edges = {("src", f"c{i}"): 0.0 for i in range(len(works))}
    one = Cluster([Device("d0", "h0", "s0", speed=1.0)])
    return Prepared(TaskGraph(tasks, edges), one, LinkCostModel(), None, 0.0)


def _order(prep: Prepared, **kw: object) -> list[str]:
    plan = heft_prepared(prep, **kw)  # type: ignore[arg-type]
    plan.validate(prep.graph, prep.cluster, prep.cost)
    return [t for t, _ in sorted(plan.placements.items(), key=lambda kv: kv[1].start)]


def test_equal_ranks_go_in_topological_order_by_default_and_reversed_when_late() -> None:
    prep = _fork((2.0, 2.0, 2.0))
    assert _order(prep) == ["src", "c0", "c1", "c2"]
    assert _order(prep, ties="late") == ["src", "c2", "c1", "c0"]
    assert heft_prepared(prep, ties="late").algorithm == "heft-ties-late"


def test_ties_never_reorder_tasks_whose_ranks_differ() -> None:
    prep = _fork((1.0, 3.0, 2.0))
    by_rank = ["src", "c1", "c2", "c0"]
    assert _order(prep) == by_rank
    assert _order(prep, ties="late") == by_rank
    assert _order(prep, ties="work") == by_rank


def test_work_tie_break_puts_the_longer_task_first() -> None:
    # equal upward ranks, different work: c0's rank adds a long sink, c1 is long itself
    tasks = [Task("c0", work=1.0), Task("c1", work=3.0), Task("sink", work=2.0)]
    graph = TaskGraph(tasks, {("c0", "sink"): 0.0})
    one = Cluster([Device("d0", "h0", "s0", speed=1.0)])
    prep = Prepared(graph, one, LinkCostModel(), None, 0.0)
    assert _order(prep) == ["c0", "c1", "sink"]
    assert _order(prep, ties="work") == ["c1", "c0", "sink"]


def test_lastdev_variant_takes_the_last_of_equal_devices() -> None:
    graph = TaskGraph([Task("a", work=1.0)], {})
    twins = Cluster([Device(f"d{j}", f"h{j}", "s0", speed=2.0) for j in range(3)])
    prep = Prepared(graph, twins, LinkCostModel(), None, 0.0)
    assert heft_prepared(prep).placements["a"].device_id == "d0"
    plan = devices_reversed(prep)
    assert plan.placements["a"].device_id == "d2"
    assert plan.algorithm == "heft-ties-lastdev"
    plan.validate(graph, twins, prep.cost)


@pytest.mark.parametrize("name", ["heft-ties-late", "heft-ties-work", "heft-ties-lastdev"])
def test_tie_variants_are_portfolio_candidates(name: str) -> None:
    assert name in {c.name for c in TIME_CANDIDATES}
