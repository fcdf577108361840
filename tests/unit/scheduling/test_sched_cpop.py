"""CPOP: the published Topcuoglu result, the critical path, and its one-device rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.scheduling import (
    Cluster,
    Device,
    LinkCostModel,
    Task,
    TaskGraph,
    Unschedulable,
    cpop,
    heft,
    load_canonical_example,
)
from orchestrator.scheduling.cpop import critical_device, critical_path
from orchestrator.scheduling.engine import Prepared
from orchestrator.scheduling.ranks import downward_rank_array, upward_rank_array

CANONICAL = Path(__file__).parents[3].parent / "shared/datasets/canonical"
TOPCUOGLU = CANONICAL / "topcuoglu2002.json"

needs_data = pytest.mark.skipif(not TOPCUOGLU.exists(), reason=f"{TOPCUOGLU} not found")


@needs_data
def test_cpop_reproduces_topcuoglu_makespan() -> None:
    ex = load_canonical_example(TOPCUOGLU)
    plan = cpop(ex.graph, ex.cluster, ex.cost)
    plan.validate(ex.graph, ex.cluster, ex.cost)
    assert plan.algorithm == "cpop"
    assert plan.makespan == pytest.approx(ex.published["CPOP_makespan"]) == 86


@needs_data
def test_topcuoglu_critical_path_runs_on_one_processor() -> None:
    """The paper's CP is n1, n2, n9, n10 (here T0, T1, T8, T9), all on its p2 (here P1)."""
    ex = load_canonical_example(TOPCUOGLU)
    prep = Prepared(ex.graph, ex.cluster, ex.cost, None, 0.0)
    priority = upward_rank_array(ex.graph, prep.w, prep.table) + downward_rank_array(
        ex.graph, prep.w, prep.table
    )
    path = critical_path(ex.graph, priority)
    assert [ex.graph.ids[i] for i in path] == ["T0", "T1", "T8", "T9"]
    assert priority[path].tolist() == pytest.approx([108.0] * 4)
    cp_dev = critical_device(prep.w, path)
    assert cp_dev is not None and ex.cluster.ids[cp_dev] == "P1"
    plan = cpop(ex.graph, ex.cluster, ex.cost)
    assert {plan.placements[t].device_id for t in ("T0", "T1", "T8", "T9")} == {"P1"}


def _chain_problem(pins: dict[str, str]) -> tuple[TaskGraph, Cluster, LinkCostModel]:
    tasks = [Task(t, work=w, pinned=pins.get(t)) for t, w in (("a", 4.0), ("b", 6.0), ("c", 4.0))]
    tasks.append(Task("side", work=1.0))
    edges = {("a", "b"): 1e6, ("b", "c"): 1e6, ("a", "side"): 0.0}
    devices = [
        Device("slow", "h0", "s0", speed=1.0),
        Device("fast", "h1", "s0", speed=2.0),
        Device("mid", "h2", "s0", speed=1.5),
    ]
    return TaskGraph(tasks, edges), Cluster(devices), LinkCostModel()


def test_critical_path_goes_to_the_device_fastest_for_all_of_it() -> None:
    graph, cluster, cost = _chain_problem({})
    plan = cpop(graph, cluster, cost)
    plan.validate(graph, cluster, cost)
    assert {plan.placements[t].device_id for t in "abc"} == {"fast"}


def test_critical_path_falls_back_to_earliest_finish_when_no_device_may_run_all() -> None:
    graph, cluster, cost = _chain_problem({"a": "slow", "c": "mid"})
    prep = Prepared(graph, cluster, cost, None, 0.0)
    assert critical_device(prep.w, [0, 1, 2]) is None
    plan = cpop(graph, cluster, cost)
    plan.validate(graph, cluster, cost)
    assert plan.placements["a"].device_id == "slow"
    assert plan.placements["c"].device_id == "mid"
    assert plan.placements["b"].device_id == "fast"  # earliest finish, not a CP device


def test_cpop_replans_around_fixed_critical_path_tasks() -> None:
    graph, cluster, cost = _chain_problem({})
    first = cpop(graph, cluster, cost)
    fixed = {"a": first.placements["a"]}
    again = cpop(graph, cluster, cost, fixed=fixed, now=1.0)
    assert again.placements["a"] == first.placements["a"]
    again.validate(graph, cluster, cost, fixed=fixed, now=1.0)


def test_cpop_reports_unschedulable_like_heft() -> None:
    graph = TaskGraph([Task("a", kinds=frozenset({"tpu"}))], {})
    cluster = Cluster([Device("d0", "h0", "s0"), Device("d1", "h1", "s0", kind="gpu")])
    with pytest.raises(Unschedulable) as got:
        cpop(graph, cluster, LinkCostModel())
    with pytest.raises(Unschedulable) as want:
        heft(graph, cluster, LinkCostModel())
    assert got.value.reasons == want.value.reasons
    assert set(got.value.reasons["a"]) == {"d0", "d1"}
