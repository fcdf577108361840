"""Inputs are validated up front, with errors that name the offending item."""

from __future__ import annotations

import pytest

from orchestrator.scheduling import Cluster, Device, Link, Task, TaskGraph


def test_graph_indexes_and_orders() -> None:
    g = TaskGraph(
        [Task("c"), Task("a"), Task("b")],
        {("a", "b"): 10.0, ("b", "c"): 0.0, ("a", "c"): 5},
    )
    assert g.topological_order() == ["a", "b", "c"]
    assert g.predecessors("c") == ["a", "b"]
    assert g.successors("a") == ["c", "b"]  # by index: c is task 0
    assert g.edges[("a", "c")] == 5.0
    assert "a" in g and "z" not in g and len(g) == 3
    assert g.task("b").id == "b"


def test_topological_order_prefers_lower_index() -> None:
    g = TaskGraph([Task("x"), Task("y"), Task("z")], {})
    assert g.topological_order() == ["x", "y", "z"]


@pytest.mark.parametrize(
    ("tasks", "edges", "match"),
    [
        (["a", "a"], {}, "duplicate task id 'a'"),
        (["a"], {("a", "b"): 1.0}, "unknown task 'b'"),
        (["a"], {("a", "a"): 1.0}, "self-loop"),
        (["a", "b"], {("a", "b"): -1.0}, "bytes must be finite"),
        (["a", "b", "c"], {("a", "b"): 1, ("b", "c"): 1, ("c", "a"): 1}, "cycle"),
    ],
)
def test_graph_rejects_bad_input(
    tasks: list[str], edges: dict[tuple[str, str], float], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        TaskGraph([Task(t) for t in tasks], edges)


def test_cluster_and_device_validation() -> None:
    with pytest.raises(ValueError, match="duplicate device id"):
        Cluster([Device("d", "a", "s"), Device("d", "b", "s")])
    with pytest.raises(ValueError, match="slots"):
        Device("d", "a", "s", slots=0)
    with pytest.raises(ValueError, match="speed"):
        Device("d", "a", "s", speed=0)
    with pytest.raises(ValueError, match="busy window"):
        Device("d", "a", "s", busy=((5.0, 1.0),))
    with pytest.raises(ValueError, match="work"):
        Task("t", work=-1)
    with pytest.raises(ValueError, match="bandwidth"):
        Link(0.0, 0.0)


def test_task_coerces_sets_to_frozensets() -> None:
    t = Task("t", kinds={"gpu"}, tiers=["edge"])  # type: ignore[arg-type]
    assert t.kinds == frozenset({"gpu"}) and t.tiers == frozenset({"edge"})


def test_cluster_lookups() -> None:
    c = Cluster([Device("d0", "a0", "s0"), Device("d1", "a0", "s1", labels={"zone": "a"})])
    assert c.device("d1").site == "s1" and "d0" in c and len(c) == 2
    assert c.agent_members["a0"].tolist() == [0, 1]
