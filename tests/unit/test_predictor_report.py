"""The predictor report's scoring rules (orchestrator.predictor.report) on hand-made data."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.predictor.report import main, metrics, pair_regret, within


def test_regret_scores_only_pairs_apart_by_more_than_the_noise_floor() -> None:
    actual = np.array([1.0, 1.5, 1.02, 2.0, 1.0, 1.0, 1.08])
    pred = np.array([2.0, 1.0, 3.0, 2.0, 1.1, 1.0, 2.0])
    noise = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.10, 0.0])
    r = pair_regret([[0, 1, 2], [3, 4], [5, 6]], pred, actual, noise, floor=0.05)
    # (0,1): picks 1 (1.5) over 0 (1.0): regret 0.5; (0,2): 2 % apart, skipped;
    # (1,2): picks 1 (1.5) over 2 (1.02): regret 1.5/1.02 - 1; (3,4): right, regret 0;
    # (5,6): 8 % apart but row 5's own passes are 10 % apart: skipped
    assert (r.pairs, r.right, r.skipped) == (3, 1, 2)
    assert r.mean == pytest.approx((0.5 + (1.5 / 1.02 - 1.0) + 0.0) / 3)
    assert r.worst == pytest.approx(0.5)


def test_regret_of_a_perfect_ranking_is_zero() -> None:
    actual = np.array([1.0, 2.0, 4.0])
    r = pair_regret([[0, 1, 2]], actual * 3.0, actual, np.zeros(3))
    assert (r.pairs, r.right, r.mean, r.worst, r.skipped, r.ties) == (3, 3, 0.0, 0.0, 0, 0)


def test_equal_predictions_are_counted_as_ties_and_pick_the_first_row() -> None:
    actual = np.array([2.0, 1.0])
    r = pair_regret([[0, 1]], np.array([5.0, 5.0]), actual, np.zeros(2))
    assert (r.pairs, r.right, r.ties) == (1, 0, 1)
    assert r.mean == pytest.approx(1.0)


def test_within_uses_the_gap_relative_to_the_smaller_value() -> None:
    a = np.array([1.0, 1.0, 1.0, 1.06])
    b = np.array([1.05, 0.96, 1.051, 1.0])
    assert within(a, b, 0.05) == pytest.approx(50.0)


def test_metrics_within_25_and_rank_correlation() -> None:
    actual = np.array([1.0, 2.0, 3.0, 4.0])
    pred = np.array([1.2, 2.6, 3.1, 4.0])  # errors 20 %, 30 %, 3.3 %, 0 %
    s = metrics(pred, actual)
    assert s["within_25"] == pytest.approx(75.0)
    assert s["within_10"] == pytest.approx(50.0)
    assert s["spearman"] == pytest.approx(1.0)


def test_report_prints_the_method_first_then_every_section(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("METHOD\n")
    heads = [out.index(s) for s in ("(a) LABEL", "(b) COLD", "(c) RIGHT", "(d) SCORING")]
    assert heads == sorted(heads)
    assert "not genuinely different devices" in out
