"""Section (e) of the predictor report (warm estimates): its pure parts, on hand-made data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.predictor.report import (
    _timed_runs,
    normalised_label,
    run_iterations,
    share_within,
    warm_estimates,
    warm_tasks,
    worst_ratio,
)
from orchestrator.predictor.train import load_dataset


def test_stored_label_is_scaled_to_the_host_speed_the_reference_kernel_reads_now() -> None:
    # 2 ms per run, 30 runs; the reference took 2.0 ms then and 2.5 ms now: 25 % slower
    assert normalised_label(0.002, 30, 0.0020, 0.0025) == pytest.approx(0.075)
    # a faster host scales it down, and an unchanged one leaves label x iterations
    assert normalised_label(0.001, 10, 0.004, 0.002) == pytest.approx(0.005)
    assert normalised_label(0.001, 10, 0.003, 0.003) == pytest.approx(0.010)


def test_iterations_make_one_run_last_at_least_50_ms_with_margin() -> None:
    assert run_iterations(0.001) == 60  # 1.2 x 50 ms / 1 ms
    assert run_iterations(0.0055, margin=1.1) == 10  # 10.000000000000002 in floats: not 11
    assert run_iterations(0.007) == 9  # 8.57 -> 9
    assert run_iterations(0.0125, margin=1.0) == 4
    assert run_iterations(0.2) == 1  # already longer than 50 ms
    assert run_iterations(1e-7) == 10_000  # OnnxRun.iterations' bound
    assert run_iterations(0.001, min_run_s=0.01, margin=1.0, cap=5) == 5


def test_within_band_counts_against_the_label() -> None:
    label = np.array([1.0, 1.0, 1.0, 1.0, 2.0])
    pred = np.array([1.0, 1.1, 1.2, 0.95, 1.85])  # errors 0, 10 %, 20 %, 5 %, 7.5 %
    assert share_within(pred, label, 0.10) == pytest.approx(80.0)
    assert share_within(pred, label, 0.05) == pytest.approx(40.0)
    assert np.isnan(share_within(np.array([]), np.array([]), 0.1))


def test_worst_ratio_is_the_furthest_from_one_either_way() -> None:
    assert worst_ratio(np.array([0.9, 1.05, 1.2, 0.5])) == 0.5
    assert worst_ratio(np.array([0.9, 1.2, 1.0])) == 1.2


def test_a_run_is_its_sess_run_calls_and_nothing_else() -> None:
    calls: list[Any] = []

    class Sess:
        def run(self, names: Any, feeds: Any) -> list[Any]:
            calls.append(feeds)
            return []

    feeds = {"x": np.zeros(1)}
    assert _timed_runs(Sess(), feeds, 7) >= 0.0
    assert len(calls) == 7 and all(f is feeds for f in calls)


def test_warm_tasks_are_the_1_thread_rows_whose_model_file_is_at_hand(tmp_path: Path) -> None:
    ds = load_dataset()
    ds = ds.where(ds.split == "test")
    tasks = warm_tasks(ds, tmp_path)  # no corpus here: only the built-in models
    assert sorted((t.model, t.batch) for t in tasks) == [
        ("digits", 1), ("digits", 8), ("tiny_cnn", 1), ("tiny_cnn", 8),
    ]  # fmt: skip
    rows = {(r["model"], int(r["batch"])): r for r in ds.rows if r["config"] == "cpu-ort-t1"}
    for t in tasks:
        r = rows[(t.model, t.batch)]
        assert (t.label_s, t.ref_s) == (float(r["label_s"]), float(r["ref_s"]))
        assert t.device.kind == "cpu" and t.device.gflops == float(r["gflops"])


def test_warm_section_says_it_is_skipped_without_the_corpus(tmp_path: Path) -> None:
    ds = load_dataset()
    out = warm_estimates(ds.where(ds.split == "test"), None, tmp_path)  # type: ignore[arg-type]
    assert out.startswith("(e) WARM (HISTORY) ESTIMATES of tasks of >= 50 ms")
    assert "skipped: no corpus" in out
