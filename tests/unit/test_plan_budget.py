"""The orchestrator's planning budget grows with the pipeline: small ones plan as fast as
with a flat budget, large ones get the portfolio."""

from __future__ import annotations

import pytest

from orchestrator.placement.budget import BUDGET_CAP_S, BUDGET_TASKS, plan_budget
from orchestrator.placement.planning import PLAN_BUDGET_S


def test_small_pipelines_get_the_base_budget() -> None:
    for tasks in (1, 5, BUDGET_TASKS):
        assert plan_budget(PLAN_BUDGET_S, tasks) == PLAN_BUDGET_S


def test_larger_pipelines_get_it_by_the_square_of_their_size_up_to_the_cap() -> None:
    assert plan_budget(0.002, 50) == pytest.approx(0.0125)
    assert plan_budget(0.002, 100) == pytest.approx(0.050)
    assert plan_budget(0.002, 200) == pytest.approx(0.200)
    assert plan_budget(0.002, 240) == pytest.approx(BUDGET_CAP_S)
    assert plan_budget(0.002, 100_000) == BUDGET_CAP_S


def test_zero_means_heft_only_and_a_base_above_the_cap_is_kept() -> None:
    assert plan_budget(0.0, 10_000) == 0.0
    assert plan_budget(1.0, 5) == 1.0
    assert plan_budget(1.0, 10_000) == 1.0
