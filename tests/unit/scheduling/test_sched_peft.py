"""PEFT: the published Arabnejad & Barbosa example, and the vectorised OCT against its
definition."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from orchestrator.scheduling import (
    Unschedulable,
    heft,
    load_canonical_example,
    optimistic_cost_table,
    peft,
)
from orchestrator.scheduling.engine import Prepared
from orchestrator.scheduling.peft import oct_array, oct_ranks

from .sched_problems import Problem, problems

# The package re-exports the function `peft`, which hides the module of the same name.
peft_module = importlib.import_module("orchestrator.scheduling.peft")

CANONICAL = Path(__file__).parents[3].parent / "shared/datasets/canonical"
ARABNEJAD = CANONICAL / "arabnejad2014.json"

needs_data = pytest.mark.skipif(not ARABNEJAD.exists(), reason=f"{ARABNEJAD} not found")


@needs_data
def test_peft_reproduces_arabnejad_makespan() -> None:
    ex = load_canonical_example(ARABNEJAD)
    plan = peft(ex.graph, ex.cluster, ex.cost)
    plan.validate(ex.graph, ex.cluster, ex.cost)
    assert plan.algorithm == "peft"
    assert plan.makespan == pytest.approx(ex.published["PEFT_makespan"]) == 122
    assert heft(ex.graph, ex.cluster, ex.cost).makespan == 133  # the paper's HEFT result


@needs_data
def test_optimistic_cost_table_matches_published() -> None:
    ex = load_canonical_example(ARABNEJAD)
    table = optimistic_cost_table(ex.graph, ex.cluster, ex.cost)
    published = ex.published["optimistic_cost_table"]
    assert table == {t: [float(v) for v in row] for t, row in published.items()}


@needs_data
def test_oct_rank_orders_tasks_as_in_the_paper() -> None:
    ex = load_canonical_example(ARABNEJAD)
    prep = Prepared(ex.graph, ex.cluster, ex.cost, None, 0.0)
    rank = oct_ranks(oct_array(ex.graph, prep.w, prep.table), prep.w)
    by_id = dict(zip(ex.graph.ids, rank.tolist(), strict=True))
    assert by_id["T0"] == pytest.approx(218 / 3)  # mean of 64, 68, 86
    assert by_id["T9"] == 0.0
    plan = peft(ex.graph, ex.cluster, ex.cost)
    assert next(iter(plan.placements)) == "T0"


def naive_oct(pb: Problem) -> np.ndarray:
    """OCT straight from the paper's formula: O(edges x devices^2) Python loops."""
    prep = Prepared(pb.graph, pb.cluster, pb.cost, None, 0.0)
    w, table, g = prep.w, prep.table, pb.graph
    m = len(pb.cluster)
    out = [[0.0] * m for _ in range(len(g))]
    for i in reversed(g.topo):
        for p in range(m):
            worst = 0.0
            for j, nbytes in g.succs[i]:
                cbar = table.mean(nbytes)
                best = math.inf
                for q in range(m):
                    v = out[j][q] + float(w[j, q]) + (0.0 if q == p else cbar)
                    best = min(best, v)
                worst = max(worst, best)
            out[i][p] = worst
    return np.asarray(out, dtype=np.float64)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_tasks=12, max_devices=5))
def test_vectorised_oct_equals_the_definition(pb: Problem) -> None:
    try:
        prep = Prepared(pb.graph, pb.cluster, pb.cost, None, 0.0)
    except Unschedulable:
        return
    want = naive_oct(pb)
    got = oct_array(pb.graph, prep.w, prep.table)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_oct_chunks_give_the_same_table(monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    from .sched_problems import random_problem

    for seed in range(100):  # the first seed whose problem is schedulable
        pb = random_problem(random.Random(seed), 30, 6, "link", 0.0)
        try:
            prep = Prepared(pb.graph, pb.cluster, pb.cost, None, 0.0)
            break
        except Unschedulable:
            continue
    whole = oct_array(pb.graph, prep.w, prep.table)
    monkeypatch.setattr(peft_module, "CHUNK", 1)  # one task per batch
    np.testing.assert_array_equal(oct_array(pb.graph, prep.w, prep.table), whole)
