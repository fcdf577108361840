"""A pipeline's predicted-vs-ran figure: summed error over summed run time, so that a task of
microseconds cannot make a close plan read as thousands of percent off."""

from __future__ import annotations

import pytest

from orchestrator.state.pipelines import PipelineRun
from schemas import PipelineSpec


def _run(times: dict[str, tuple[str, float | None, float | None]]) -> PipelineRun:
    spec = PipelineSpec.model_validate(
        {"name": "p", "tasks": [{"id": t, "run": {"kind": "synthetic"}} for t in times]}
    )
    run = PipelineRun("p1", spec, submitted_at=0.0)
    for tid, (state, predicted, ran) in times.items():
        tr = run.tasks[tid]
        tr.state, tr.predicted_s, tr.duration_s = state, predicted, ran  # type: ignore[assignment]
    return run


def test_error_is_summed_over_summed_run_time() -> None:
    run = _run({
        "a": ("succeeded", 0.168, 0.135),
        "b": ("succeeded", 0.050, 0.108),
        "c": ("succeeded", 0.006, 0.0001),  # an accelerator's few microseconds
        "d": ("succeeded", 0.050, 0.102),
    })  # fmt: skip
    off = 0.033 + 0.058 + 0.0059 + 0.052
    pct = run.prediction_error_pct()
    assert pct == pytest.approx(100 * off / (0.135 + 0.108 + 0.0001 + 0.102))
    assert pct is not None and pct < 50  # a mean of ratios would read ~1,500 %


def test_only_succeeded_tasks_with_both_figures_count() -> None:
    run = _run({
        "a": ("succeeded", 2.0, 1.0),
        "b": ("failed", 9.0, 1.0),
        "c": ("succeeded", None, 5.0),
        "d": ("running", 3.0, None),
    })  # fmt: skip
    assert run.prediction_error_pct() == pytest.approx(100.0)
    assert _run({"a": ("running", 1.0, None)}).prediction_error_pct() is None
    assert _run({"a": ("succeeded", 1.0, 0.0)}).prediction_error_pct() is None
