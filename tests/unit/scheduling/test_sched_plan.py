"""Plan.validate catches every kind of broken plan, and says which invariant broke."""

from __future__ import annotations

import pytest

from orchestrator.scheduling import (
    Cluster,
    Device,
    Link,
    LinkCostModel,
    Placement,
    Plan,
    PlanError,
    Task,
    TaskGraph,
)

CLUSTER = Cluster(
    [
        Device("d0", "a0", "s0", slots=2, busy=((10.0, 12.0),)),
        Device("d1", "a1", "s1", kind="gpu"),
    ]
)
COST = LinkCostModel({("s0", "s1"): Link(1.0, 1e6)})  # 1 MB across sites: 1 s + 1 s
GRAPH = TaskGraph(
    [Task("a", work=2.0), Task("b", work=2.0), Task("c", work=1.0, kinds=frozenset({"cpu"}))],
    {("a", "b"): 1e6},
)
GOOD = {
    "a": Placement("a", "d0", 0, 0.0, 2.0),
    "b": Placement("b", "d1", 0, 4.0, 6.0),
    "c": Placement("c", "d0", 1, 0.0, 1.0),
}


def violations(placements: dict[str, Placement], **kw: object) -> list[str]:
    try:
        Plan(placements, "hand").validate(GRAPH, CLUSTER, COST, **kw)  # type: ignore[arg-type]
    except PlanError as exc:
        assert exc.violations and str(len(exc.violations)) in str(exc)
        return exc.violations
    return []


def with_(**changes: Placement) -> dict[str, Placement]:
    return {**GOOD, **changes}


def test_good_plan_passes() -> None:
    assert violations(GOOD) == []
    assert Plan(GOOD).makespan == 6.0
    assert Plan().makespan == 0.0
    assert [p.task_id for p in Plan(GOOD).by_device()["d0"]] == ["a", "c"]


@pytest.mark.parametrize(
    ("placements", "expect"),
    [
        (with_(c=Placement("c", "d0", 0, 1.0, 2.0)), "c and a overlap on d0 slot 0"),
        (with_(b=Placement("b", "d1", 1, 4.0, 6.0)), "slot 1 out of range on d1"),
        (with_(b=Placement("b", "d1", 0, 3.0, 5.0)), "before input from a arrives at 4"),
        (with_(b=Placement("b", "d0", 1, 1.0, 3.0)), "before input from a arrives at 2"),
        (with_(c=Placement("c", "d1", 0, 7.0, 8.0)), "c: ineligible on d1: kind gpu not in {cpu}"),
        (with_(c=Placement("c", "d0", 1, 9.5, 10.5)), "overlaps busy window [10, 12) on d0"),
        (with_(c=Placement("c", "d0", 1, 0.0, 3.0)), "duration 3 != compute time 1"),
        (with_(c=Placement("c", "zz", 0, 0.0, 1.0)), "unknown device 'zz'"),
        (with_(c=Placement("c", "d0", 2, 0.0, 1.0)), "slot 2 out of range on d0"),
        ({k: v for k, v in GOOD.items() if k != "b"}, "b: not placed"),
        (with_(x=Placement("x", "d0", 1, 3.0, 4.0)), "x: not a task of the graph"),
        (with_(c2=GOOD["c"]), "placement keyed 'c2' is for task 'c'"),
    ],
)
def test_each_violation_is_reported(placements: dict[str, Placement], expect: str) -> None:
    found = violations(placements)
    assert any(expect in v for v in found), found


def test_start_before_now() -> None:
    found = violations(GOOD, now=0.5)
    assert any("a: starts at 0, before now=0.5" in v for v in found)


def test_fixed_placements_must_be_unchanged_but_are_otherwise_facts() -> None:
    ran_long = GOOD["a"]._replace(finish=2.5)  # ran longer than predicted
    fixed = {"a": ran_long, "c": GOOD["c"]}
    found = violations(GOOD, fixed=fixed)
    assert any("a: fixed placement changed" in v for v in found)
    # fixed tasks may differ from their prediction and sit before `now`
    replanned = with_(a=ran_long, b=Placement("b", "d1", 0, 4.5, 6.5))
    assert violations(replanned, fixed=fixed, now=3.0) == []
    # ... but nothing else may collide with them
    fixed["a"] = replanned["a"] = ran_long._replace(finish=3.5)
    replanned["c"] = Placement("c", "d0", 0, 3.0, 4.0)
    del fixed["c"]
    found = violations(replanned, fixed=fixed, now=3.0)
    assert any("c and a overlap on d0 slot 0" in v for v in found), found


def test_zero_length_windows_never_collide() -> None:
    graph = TaskGraph([Task("z", work=0.0), Task("y", work=2.0)], {})
    cluster = Cluster([Device("d0", "a0", "s0", busy=((1.0, 1.0),))])
    plan = Plan({"y": Placement("y", "d0", 0, 0.0, 2.0), "z": Placement("z", "d0", 0, 1.0, 1.0)})
    plan.validate(graph, cluster, COST)
