"""Eligibility: one reason per refusal, and the vectorised mask agrees with the rule."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.scheduling import (
    Cluster,
    Device,
    LinkCostModel,
    Task,
    TaskGraph,
    Unschedulable,
    eligibility_mask,
    eligible_everywhere,
    heft,
    ineligibility,
)

from .sched_problems import random_cluster, random_task

CPU = Device("cpu0", "agent0", "s0", tier="edge", kind="cpu", memory_mb=512, labels={"zone": "b"})


def test_reasons_are_human_readable() -> None:
    assert ineligibility(Task("t"), CPU) is None
    assert ineligibility(Task("t", kinds=frozenset({"gpu"})), CPU) == "kind cpu not in {gpu}"
    assert ineligibility(Task("t", min_memory_mb=1024), CPU) == "memory 512 < 1024 MB"
    assert (
        ineligibility(Task("t", labels={"zone": "a"}), CPU) == "missing label zone=a (has zone=b)"
    )
    assert ineligibility(Task("t", labels={"gpu": "h100"}), CPU) == "missing label gpu=h100"
    assert (
        ineligibility(Task("t", tiers=frozenset({"cloud", "fog"})), CPU)
        == "tier edge not allowed (allowed: {cloud, fog})"
    )
    assert ineligibility(Task("t", pinned="elsewhere"), CPU) == "pinned to elsewhere"
    assert ineligibility(Task("t", pinned="cpu0"), CPU) is None
    assert ineligibility(Task("t", pinned="agent0"), CPU) is None


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_mask_agrees_with_ineligibility(seed: int) -> None:
    rng = random.Random(seed)
    cluster = random_cluster(rng, rng.randint(1, 8))
    for i in range(20):
        task = random_task(rng, i, cluster)
        want = [ineligibility(task, d) is None for d in cluster]
        assert eligibility_mask(task, cluster).tolist() == want
        assert eligible_everywhere(task, cluster) == all(want)


def test_unschedulable_lists_every_device_and_why() -> None:
    gpu_far = Device("gpu0", "agent1", "s1", tier="cloud", kind="gpu", memory_mb=256)
    cluster = Cluster([CPU, gpu_far])
    graph = TaskGraph(
        [
            Task("ok"),
            Task("big-gpu", kinds=frozenset({"gpu"}), min_memory_mb=1024),
            Task("zoned", labels={"zone": "a"}),
        ],
        {("ok", "big-gpu"): 1.0},
    )
    try:
        heft(graph, cluster, LinkCostModel())
    except Unschedulable as exc:
        assert exc.reasons == {
            "big-gpu": {"cpu0": "kind cpu not in {gpu}", "gpu0": "memory 256 < 1024 MB"},
            "zoned": {"cpu0": "missing label zone=a (has zone=b)", "gpu0": "missing label zone=a"},
        }
        text = str(exc)
        assert "2 task(s) have no eligible device" in text
        assert "big-gpu: cpu0: kind cpu not in {gpu}; gpu0: memory 256 < 1024 MB" in text
    else:
        raise AssertionError("expected Unschedulable")


def test_unschedulable_on_empty_cluster_and_pickles() -> None:
    import pickle

    try:
        heft(TaskGraph([Task("t")], {}), Cluster([]), LinkCostModel())
    except Unschedulable as exc:
        assert exc.reasons == {"t": {}}
        assert "the cluster has no devices" in str(exc)
        again = pickle.loads(pickle.dumps(exc))
        assert again.reasons == exc.reasons
    else:
        raise AssertionError("expected Unschedulable")


def test_fixed_tasks_need_no_eligible_device() -> None:
    from orchestrator.scheduling import Placement

    graph = TaskGraph([Task("done", kinds=frozenset({"tpu"})), Task("next")], {("done", "next"): 0})
    cluster = Cluster([CPU])
    fixed = {"done": Placement("done", "cpu0", 0, 0.0, 2.0)}
    plan = heft(graph, cluster, LinkCostModel(), fixed=fixed, now=1.0)
    assert plan.placements["next"].start == 2.0
    plan.validate(graph, cluster, LinkCostModel(), fixed=fixed, now=1.0)
