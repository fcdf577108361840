"""Candidate pre-filtering, and the site-link arrays that make huge clusters cheap to plan on."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.scheduling import (
    Cluster,
    Device,
    Link,
    LinkCostModel,
    Placement,
    Task,
    TaskGraph,
    Unschedulable,
    heft,
    portfolio,
    prefilter_cluster,
)
from orchestrator.scheduling.engine import Prepared
from orchestrator.scheduling.money import site_prices
from orchestrator.scheduling.prefilter import prefilter_indices

from .sched_problems import Problem, problems, random_cluster, usable

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fixed_prefix(pb: Problem, seed: int) -> dict[str, Placement]:
    """A predecessor-closed set of HEFT's placements (empty if unschedulable)."""
    try:
        plan = heft(pb.graph, pb.cluster, pb.cost, now=pb.now)
    except Unschedulable:
        return {}
    rng = random.Random(seed)
    order = pb.graph.topological_order()
    return {t: plan.placements[t] for t in order[: rng.randrange(len(order) + 1)]}


@SETTINGS
@given(problems(max_tasks=12, max_devices=16), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_prefilter_keeps_every_task_schedulable_and_stays_small(
    pb: Problem, k: int, seed: int
) -> None:
    fixed = _fixed_prefix(pb, seed)
    small = prefilter_cluster(pb.graph, pb.cluster, pb.cost, k, fixed=fixed, now=pb.now)
    again = prefilter_cluster(pb.graph, pb.cluster, pb.cost, k, fixed=fixed, now=pb.now)
    assert small.ids == again.ids  # deterministic
    assert set(small.ids) <= set(pb.cluster.ids)
    assert list(small.ids) == [d for d in pb.cluster.ids if d in small]  # original order
    for tid in pb.graph.ids:
        if tid in fixed:
            continue
        task = pb.graph.task(tid)
        if any(usable(task, d, pb.cost) for d in pb.cluster):
            assert any(usable(task, d, pb.cost) for d in small), tid
        pin = task.pinned
        if pin is not None and pin in pb.cluster and usable(task, pb.cluster.device(pin), pb.cost):
            assert pin in small
    fixed_devices = {p.device_id for p in fixed.values()}
    assert fixed_devices <= set(small.ids)
    # at most k, plus each constraint class's best device and the fixed ones; a model that
    # refuses single tasks (the matrix flavour) may add one device per task
    n_classes = len(
        {
            (t.pinned, t.kinds, t.tiers, t.min_memory_mb, tuple(t.labels.items()))
            for t in pb.graph.tasks
        }
    )
    extra = len(pb.graph) if pb.flavour == "matrix" else 0
    assert len(small) <= max(k, len(fixed_devices) + n_classes) + extra
    if len(pb.cluster) <= k:
        assert small is pb.cluster


@SETTINGS
@given(problems(max_tasks=10, max_devices=16), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_prefiltered_portfolio_validates_on_the_full_cluster(
    pb: Problem, k: int, seed: int
) -> None:
    fixed = _fixed_prefix(pb, seed)
    try:
        plan = portfolio(pb.graph, pb.cluster, pb.cost, fixed=fixed, now=pb.now, prefilter=k)
    except Unschedulable as exc:
        for tid, by_dev in exc.reasons.items():
            assert not any(usable(pb.graph.task(tid), d, pb.cost) for d in pb.cluster)
            assert set(by_dev) == set(pb.cluster.ids)
        return
    plan.validate(pb.graph, pb.cluster, pb.cost, fixed=fixed, now=pb.now)
    for tid, p in fixed.items():
        assert plan.placements[tid] == p


def test_prefilter_keeps_the_fastest_devices_per_class() -> None:
    devices = [Device(f"c{i}", f"h{i}", "s0", speed=1.0 + i) for i in range(6)]
    devices += [Device(f"g{i}", f"x{i}", "s0", kind="gpu", speed=0.5 + i) for i in range(4)]
    cluster = Cluster(devices)
    tasks = [Task(f"t{i}") for i in range(6)] + [Task("g", kinds=frozenset({"gpu"}))]
    graph = TaskGraph(tasks, {})
    small = prefilter_cluster(graph, cluster, LinkCostModel(), 3)
    # the gpu class keeps its best; the 6-task class the two fastest overall (g3 is 3.5)
    assert small.ids == ("c4", "c5", "g3")
    assert prefilter_indices(graph, cluster, LinkCostModel(), 3).tolist() == [4, 5, 9]
    with pytest.raises(ValueError, match="k must be"):
        prefilter_cluster(graph, cluster, LinkCostModel(), 0)


def test_prefilter_keeps_devices_near_the_data() -> None:
    """A camera's heavy output: a slower device at the camera's site beats a fast one across
    a slow WAN, so the near one must survive filtering."""
    devices = [Device("cam", "cam", "site-a", speed=0.1), Device("near", "gw", "site-a", speed=2.0)]
    devices += [Device(f"far{i}", f"vm{i}", "cloud", speed=4.0) for i in range(5)]
    cluster = Cluster(devices)
    graph = TaskGraph(
        [Task("capture", pinned="cam"), Task("detect", work=2.0)], {("capture", "detect"): 1e9}
    )
    cost = LinkCostModel(wan=Link(0.1, 1e6))
    small = prefilter_cluster(graph, cluster, cost, 2)
    assert small.ids == ("cam", "near")
    plan = portfolio(graph, cluster, cost, prefilter=2)
    assert plan.placements["detect"].device_id == "near"
    assert plan.makespan == heft(graph, cluster, cost).makespan


def test_prefilter_prefers_devices_free_now() -> None:
    devices = [
        Device("busy", "h0", "s0", speed=3.0, busy=((0.0, 100.0),)),
        Device("free", "h1", "s0", speed=2.0),
        Device("slow", "h2", "s0", speed=1.0),
    ]
    graph = TaskGraph([Task("t", work=2.0)], {})
    small = prefilter_cluster(graph, Cluster(devices), LinkCostModel(), 1)
    assert small.ids == ("free",)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 12))
def test_site_link_arrays_agree_with_the_link_rule(seed: int, n: int) -> None:
    """The site arrays give link()'s exact values: rows, dense matrices, means, prices."""
    rng = random.Random(seed)
    cluster = random_cluster(rng, n)
    names = [*sorted(cluster.sites), "elsewhere", "other"]  # links may name absent sites
    links = {
        (a, b): Link(rng.uniform(0, 0.3), rng.uniform(1e5, 1e9), rng.uniform(0, 1))
        for a in names
        for b in names
        if rng.random() < 0.4
    }
    model = LinkCostModel(
        links,
        lan=Link(0.002, 3e8, 0.01),
        wan=Link(0.2, 1e6, 0.5),
        local_Bps=rng.choice([5e7, 1e10]),
    )
    table = model.transfer_table(cluster)
    dense = table.dense()
    assert dense is not None
    pairs = [(a, b) for a in cluster.devices for b in cluster.devices if a is not b]
    for nbytes in (0.0, 1234.5, 3e8):
        for i, src in enumerate(cluster.devices):
            want = [model.transfer_time(nbytes, src, dst) for dst in cluster.devices]
            assert table.row(nbytes, i).tolist() == want  # bit-for-bit
            assert ((nbytes / dense[1][i]) + dense[0][i]).tolist() == want
        if pairs:
            brute = sum(model.transfer_time(nbytes, a, b) for a, b in pairs) / len(pairs)
            assert table.mean(nbytes) == pytest.approx(brute, rel=1e-9, abs=1e-15)
    prices = site_prices(cluster, model)
    site_of = {code: name for name, code in cluster.sites.items()}
    for s in range(len(cluster.sites)):
        for d, dev in enumerate(cluster.devices):
            a, b = site_of[s], dev.site
            want_price = 0.0 if a == b else model.link(a, b).cost_per_gb / 1e9
            assert prices is None or prices[s, d] == pytest.approx(want_price, abs=1e-24)


def test_prefilter_tolerates_tasks_no_device_can_run() -> None:
    cluster = Cluster([Device(f"d{i}", f"h{i}", "s0") for i in range(5)])
    graph = TaskGraph([Task("a"), Task("b", pinned="nowhere")], {})
    small = prefilter_cluster(graph, cluster, LinkCostModel(), 2)
    assert len(small) <= 2
    with pytest.raises(Unschedulable):
        Prepared(graph, small, LinkCostModel(), None, 0.0)
