"""HEFT on small hand-made cases whose right answer is obvious."""

from __future__ import annotations

from orchestrator.scheduling import (
    Cluster,
    Device,
    Link,
    LinkCostModel,
    MatrixCostModel,
    Placement,
    Task,
    TaskGraph,
    heft,
)

COST = LinkCostModel()


def test_independent_tasks_use_all_slots() -> None:
    graph = TaskGraph([Task(f"t{i}", work=1.0) for i in range(4)], {})
    cluster = Cluster([Device("d0", "a0", "s0", slots=4)])
    plan = heft(graph, cluster, COST)
    assert sorted(p.slot for p in plan.placements.values()) == [0, 1, 2, 3]
    assert plan.makespan == 1.0


def test_busy_windows_block_every_slot_and_gaps_are_used() -> None:
    cluster = Cluster([Device("d0", "a0", "s0", slots=2, busy=((1.0, 5.0),))])
    graph = TaskGraph([Task("long", work=3.0), Task("short", work=1.0)], {})
    plan = heft(graph, cluster, COST)
    assert plan.placements["long"].start == 5.0  # does not fit in [0, 1)
    assert plan.placements["short"].start == 0.0  # fits the gap before the window
    plan.validate(graph, cluster, COST)


def test_insertion_fills_a_gap_left_by_communication() -> None:
    # b must wait for a's data from another site; c is independent and fits before b on d1
    cost = MatrixCostModel(
        {"a": {"d0": 1.0, "d1": 50.0}, "b": {"d0": 50.0, "d1": 1.0}, "c": {"d0": 40, "d1": 2.0}}
    )
    cluster = Cluster([Device("d0", "a0", "s0"), Device("d1", "a1", "s1")])
    graph = TaskGraph([Task("a"), Task("b"), Task("c")], {("a", "b"): 5.0})
    with_ins = heft(graph, cluster, cost)
    assert with_ins.placements["b"] == Placement("b", "d1", 0, 6.0, 7.0)
    assert with_ins.placements["c"] == Placement("c", "d1", 0, 0.0, 2.0)
    without = heft(graph, cluster, cost, insertion=False)
    assert without.placements["c"].start == 7.0
    assert without.algorithm == "heft-noins" and with_ins.algorithm == "heft"


def test_now_and_fixed_running_task() -> None:
    cluster = Cluster([Device("d0", "a0", "s0"), Device("d1", "a1", "s0", speed=0.5)])
    graph = TaskGraph([Task("a", work=4.0), Task("b", work=1.0)], {("a", "b"): 0.0})
    running = {"a": Placement("a", "d0", 0, 0.0, 4.0)}
    plan = heft(graph, cluster, COST, fixed=running, now=2.0)
    assert plan.placements["a"] == running["a"]
    assert plan.placements["b"] == Placement("b", "d0", 0, 4.0, 5.0)
    plan.validate(graph, cluster, COST, fixed=running, now=2.0)
    later = heft(TaskGraph([Task("x")], {}), cluster, COST, now=10.0)
    assert later.placements["x"].start == 10.0


def test_communication_pulls_consumer_to_producer() -> None:
    slow_wan = LinkCostModel({("s0", "s1"): Link(10.0, 1e6)})
    cluster = Cluster([Device("d0", "a0", "s0"), Device("d1", "a1", "s1", speed=4.0)])
    graph = TaskGraph([Task("a"), Task("b", work=4.0)], {("a", "b"): 1e6})
    plan = heft(graph, cluster, slow_wan)
    assert plan.placements["a"].device_id == "d1"  # the faster device, and b follows it
    assert plan.placements["b"].device_id == "d1"


def test_pinning_to_an_agent() -> None:
    cluster = Cluster([Device("fast", "a0", "s0", speed=10.0), Device("slow", "a1", "s0")])
    graph = TaskGraph([Task("t", pinned="a1")], {})
    assert heft(graph, cluster, COST).placements["t"].device_id == "slow"


def test_ties_go_to_the_lower_device_index() -> None:
    cluster = Cluster([Device(f"d{i}", f"a{i}", "s0") for i in range(5)])
    plan = heft(TaskGraph([Task("t")], {}), cluster, COST)
    assert plan.placements["t"] == Placement("t", "d0", 0, 0.0, 1.0)


def test_empty_graph() -> None:
    plan = heft(TaskGraph([], {}), Cluster([]), COST)
    assert plan.placements == {} and plan.makespan == 0.0
