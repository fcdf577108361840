"""Generated WfCommons workflows: the same arguments give the same graph, and CCR scaling sets
the ratio of mean transfer to mean compute time."""

from __future__ import annotations

import pytest

pytest.importorskip("wfcommons")

from benchmarks.wfgen import recipe_workflow, with_ccr


def test_a_seed_fixes_the_workflow() -> None:
    a = recipe_workflow("soykb", 120, seed=3)
    b = recipe_workflow("soykb", 120, seed=3)
    assert [(t.id, t.work) for t in a] == [(t.id, t.work) for t in b]
    assert a.edges == b.edges
    assert 100 <= len(a) <= 130 and len(a.edges) > len(a)


@pytest.mark.parametrize("ccr", [0.1, 1.0, 10.0])
def test_ccr_scaling_sets_the_ratio(ccr: float) -> None:
    g = recipe_workflow("montage", 120)
    scaled = with_ccr(g, ccr, mean_speed=2.0, bandwidth=4.0)
    comp = sum(t.work for t in scaled) / len(scaled) / 2.0
    comm = sum(scaled.edges.values()) / len(scaled.edges) / 4.0
    assert comm / comp == pytest.approx(ccr)
    assert set(scaled.edges) == set(g.edges)
