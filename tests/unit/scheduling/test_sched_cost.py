"""Cost models: the documented transfer rules, and vector tables that agree with them."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from orchestrator.scheduling import (
    DEFAULT_LAN,
    DEFAULT_WAN,
    Cluster,
    Device,
    Link,
    LinkCostModel,
    MatrixCostModel,
    Task,
)
from orchestrator.scheduling.transfer import GenericTransferTable

from .sched_problems import random_cluster

D0 = Device("d0", "a0", "s0", speed=2.0)
D1 = Device("d1", "a0", "s0")  # same agent as d0
D2 = Device("d2", "a1", "s0")  # same site, other agent
D3 = Device("d3", "a2", "s1")  # other site
D4 = Device("d4", "a3", "s2")


def test_link_cost_model_rules() -> None:
    wan_s0_s1 = Link(0.05, 1e7)
    lan_s2 = Link(0.0, 1e8)
    m = LinkCostModel({("s1", "s0"): wan_s0_s1, ("s2", "s2"): lan_s2}, local_Bps=1e9)
    mb = 1e6
    assert m.compute_time(Task("t", work=3.0), D0) == 1.5
    assert m.transfer_time(mb, D0, D0) == 0.0
    assert m.transfer_time(mb, D0, D1) == mb / 1e9
    assert m.transfer_time(mb, D0, D2) == DEFAULT_LAN.latency_s + mb / DEFAULT_LAN.bandwidth_Bps
    assert m.transfer_time(mb, D0, D3) == 0.05 + mb / 1e7  # symmetric lookup of (s1, s0)
    assert m.transfer_time(mb, D3, D0) == 0.05 + mb / 1e7
    assert m.transfer_time(mb, D0, D4) == DEFAULT_WAN.latency_s + mb / DEFAULT_WAN.bandwidth_Bps
    d5 = Device("d5", "a9", "s2")
    assert m.transfer_time(mb, D4, d5) == mb / 1e8  # the site's own LAN link
    assert Link(1e-3, 125e6) == DEFAULT_LAN and Link(0.1, 25e6 / 8) == DEFAULT_WAN


def test_link_lookup_prefers_the_exact_direction() -> None:
    m = LinkCostModel({("s0", "s1"): Link(1.0, 1e6), ("s1", "s0"): Link(2.0, 1e6)})
    assert m.transfer_time(0.0, D0, D3) == 1.0
    assert m.transfer_time(0.0, D3, D0) == 2.0
    table = m.transfer_table(Cluster([D0, D3]))
    assert table.row(0.0, 0).tolist() == [0.0, 1.0]
    assert table.row(0.0, 1).tolist() == [2.0, 0.0]


def _brute_mean(model: LinkCostModel, cluster: Cluster, nbytes: float) -> float:
    devs = cluster.devices
    vals = [model.transfer_time(nbytes, a, b) for a in devs for b in devs if a is not b]
    return sum(vals) / len(vals) if vals else 0.0


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 9))
def test_link_table_agrees_with_pairwise_rule(seed: int, n: int) -> None:
    rng = random.Random(seed)
    cluster = random_cluster(rng, n)
    sites = sorted(cluster.sites)
    links = {
        (a, b): Link(rng.uniform(0, 0.3), rng.uniform(1e5, 1e9))
        for a in sites
        for b in sites
        if rng.random() < 0.4
    }
    model = LinkCostModel(links, local_Bps=rng.choice([5e7, 1e10]))
    table = model.transfer_table(cluster)
    for nbytes in (0.0, 1234.5, 3e8):
        for i, src in enumerate(cluster.devices):
            want = [model.transfer_time(nbytes, src, dst) for dst in cluster.devices]
            assert table.row(nbytes, i).tolist() == want  # bit-for-bit
        assert table.mean(nbytes) == pytest.approx(_brute_mean(model, cluster, nbytes))
    tasks = [Task("x", work=2.5), Task("y", work=0.0)]
    w = model.compute_matrix(tasks, cluster)
    assert w.tolist() == [[model.compute_time(t, d) for d in cluster] for t in tasks]


def test_link_table_rows_are_fresh_arrays() -> None:
    table = LinkCostModel().transfer_table(Cluster([D0, D2, D3]))
    row = table.row(10.0, 0)
    row += 100.0
    assert table.row(10.0, 0)[1] == pytest.approx(1e-3 + 10.0 / 125e6)


def test_link_table_is_kept_for_the_last_cluster_only() -> None:
    """The algorithms of a portfolio share one cluster's table; another cluster (another
    snapshot, even of the same devices) gets its own, never a stale one."""
    model = LinkCostModel({("s0", "s1"): Link(0.05, 1e6)})
    first = Cluster([D0, D2, D3])
    table = model.transfer_table(first)
    assert model.transfer_table(first) is table
    other = Cluster([D3, D0])
    moved = model.transfer_table(other)
    assert moved is not table
    assert moved.row(1e6, 0).tolist() == [0.0, 0.05 + 1.0]  # d3 (s1) to d0 (s0), its own view
    again = model.transfer_table(first)
    assert again is not table  # only the last cluster is kept
    assert again.row(1e6, 0).tolist() == table.row(1e6, 0).tolist()


def test_matrix_cost_model() -> None:
    m = MatrixCostModel({"t": {"d0": 4.0, "d2": 7.0}})
    cluster = Cluster([D0, D1, D2])
    t = Task("t")
    assert m.compute_time(t, D0) == 4.0
    assert m.compute_time(t, D1) == float("inf")
    assert m.compute_time(Task("other"), D0) == float("inf")
    assert m.transfer_time(12.0, D0, D1) == 12.0
    assert m.transfer_time(12.0, D0, D0) == 0.0
    assert m.compute_matrix([t], cluster).tolist() == [[4.0, float("inf"), 7.0]]
    table = m.transfer_table(cluster)
    assert table.row(5.0, 1).tolist() == [5.0, 0.0, 5.0]
    assert table.mean(5.0) == 5.0


def test_generic_table_matches_pairs_and_estimates_mean() -> None:
    model = LinkCostModel({("s0", "s1"): Link(0.2, 1e6)})
    cluster = Cluster([D0, D1, D2, D3, D4])
    table = GenericTransferTable(model.transfer_time, cluster.devices)
    assert table.row(1e5, 3).tolist() == [model.transfer_time(1e5, D3, d) for d in cluster.devices]
    # every device is in the sample here, and transfer time is affine in bytes
    assert table.mean(4e6) == pytest.approx(_brute_mean(model, cluster, 4e6))
    assert np.isfinite(GenericTransferTable(model.transfer_time, [D0]).mean(1.0))


@pytest.mark.parametrize("other", [1.0, math.nan, math.inf])
def test_cost_arrays_refuse_negative_times_and_mark_unusable_pairs(other: float) -> None:
    """A negative compute time is an error even beside NaN; NaN and inf become inf (cannot
    run), as does an ineligible pair; the result is a copy, not the model's own array."""
    from orchestrator.scheduling.constraints import eligibility_matrix
    from orchestrator.scheduling.cost import cost_arrays
    from orchestrator.scheduling.model import TaskGraph

    cluster = Cluster([D0, D1])
    graph = TaskGraph([Task("a"), Task("b", kinds=frozenset({"gpu"}))], {})
    eligible = eligibility_matrix(graph, cluster)
    assert eligible.tolist() == [[True, True], [False, False]]
    bad = MatrixCostModel({"a": {"d0": -1.0, "d1": other}, "b": {"d0": 1.0, "d1": 1.0}})
    with pytest.raises(ValueError, match="negative"):
        cost_arrays(bad, graph.tasks, cluster, eligible)
    model = MatrixCostModel({"a": {"d0": 2.0, "d1": other}, "b": {"d0": 1.0, "d1": 1.0}})
    w, _ = cost_arrays(model, graph.tasks, cluster, eligible)
    want_d1 = other if math.isfinite(other) else math.inf
    assert w.tolist() == [[2.0, want_d1], [math.inf, math.inf]]
    everywhere = np.ones((2, 2), dtype=np.bool_)

    class Keeps(MatrixCostModel):
        """Hands out the same array on every call."""

        kept = np.array([[2.0, 3.0], [1.0, 1.0]])

        def compute_matrix(self, tasks: Sequence[Task], cluster: Cluster) -> NDArray[np.float64]:
            return self.kept

    w2, _ = cost_arrays(Keeps({}), graph.tasks, cluster, everywhere)
    w2[0, 0] = 99.0
    assert Keeps.kept.tolist() == [[2.0, 3.0], [1.0, 1.0]]
