"""The fast paths of the rank helpers compute exactly what their general forms compute."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.scheduling.ranks import (
    SMALL_KEYS,
    _array_keys,
    _small_keys,
    mean_compute,
    priority_keys,
)

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
rank_value = st.one_of(finite, st.just(math.inf), st.sampled_from([0.0, 0.5, 1.5, 2.5, 80.0]))


@settings(max_examples=300, deadline=None)
@given(st.lists(rank_value, min_size=0, max_size=SMALL_KEYS))
def test_small_keys_are_the_array_keys(ranks: list[float]) -> None:
    """Python floats and `round` (half to even, as `np.rint`) give the same keys."""
    arr = np.asarray(ranks, dtype=np.float64)
    assert _small_keys(ranks) == _array_keys(arr)
    assert priority_keys(arr) == _array_keys(arr)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 12),
    st.integers(1, 40),
    st.integers(0, 2**32 - 1),
    st.booleans(),
)
def test_mean_compute_fast_path_is_the_masked_mean(n: int, m: int, seed: int, gaps: bool) -> None:
    """All finite: the plain row mean; otherwise the mean over finite entries (inf if none);
    both bit for bit what the masked formula gives."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.0, 100.0, size=(n, m))
    if gaps:
        w[rng.random((n, m)) < 0.3] = math.inf
    finite_mask = np.isfinite(w)
    count = finite_mask.sum(axis=1)
    total = np.where(finite_mask, w, 0.0).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.where(count > 0, total / np.maximum(count, 1), np.inf)
    assert mean_compute(w).tolist() == want.tolist()
