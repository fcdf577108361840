"""Online correction: repeated tasks converge to their measured time; outliers are rejected."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.predictor.correction import Corrections, Track
from schemas.predictor import CorrectionTrack

ratios = st.floats(min_value=0.02, max_value=50.0)
noise = st.lists(st.floats(min_value=-0.02, max_value=0.02), min_size=5, max_size=5)


@settings(max_examples=200, deadline=None)
@given(base=st.floats(min_value=1e-5, max_value=100.0), true=ratios, eps=noise)
def test_within_5_percent_after_5_reports(base: float, true: float, eps: list[float]) -> None:
    c = Corrections()
    actual = base * true
    for e in eps:
        c.observe("sig", "dev", base, actual * (1.0 + e), 0.0)
    assert abs(base * c.factor("sig", "dev") - actual) / actual <= 0.05


@settings(max_examples=200, deadline=None)
@given(true=ratios, spike=st.floats(min_value=2.0, max_value=100.0), up=st.booleans())
def test_single_outlier_is_rejected(true: float, spike: float, up: bool) -> None:
    c = Corrections()
    for i in range(6):
        c.observe("s", "d", 1.0, true * (1.0 + 0.01 * (i % 3 - 1)), 0.0)
    before = c.factor("s", "d")
    odd = true * spike if up else true / spike
    assert not c.observe("s", "d", 1.0, odd, 0.0)
    assert c.factor("s", "d") == before


def test_a_consistent_shift_is_a_new_regime_not_an_outlier() -> None:
    c = Corrections()
    for _ in range(6):
        c.observe("s", "d", 1.0, 2.0, 0.0)
    assert not c.observe("s", "d", 1.0, 8.0, 0.0)
    assert not c.observe("s", "d", 1.0, 8.1, 0.0)
    assert c.observe("s", "d", 1.0, 7.9, 0.0)
    assert math.isclose(c.factor("s", "d"), 8.0, rel_tol=0.02)


def test_tracks_are_per_signature_and_device_and_round_trip() -> None:
    c = Corrections()
    c.observe("s", "a", 1.0, 3.0, 5.0)
    assert c.factor("s", "b") == 1.0 and c.factor("t", "a") == 1.0
    t = c.get("s", "a")
    assert t is not None and Track(**CorrectionTrack(**t.to_dict()).model_dump()) == t
    assert not c.observe("s", "a", 0.0, 1.0, 0.0)  # nothing to compare against


def test_history_writes_a_track_when_it_has_grown_or_moved() -> None:
    """A single sample is not written; then writes follow count doublings and shifts of the
    factor, and at stop whatever changed since the last write."""
    from orchestrator.predictor.correction import Track
    from orchestrator.predictor.history import (
        MIN_SAVE_N,
        MIN_SAVE_SHIFT,
        MIN_SHIFT_GAP_S,
        REFRESH_S,
        due,
    )

    assert not due(Track(n=1, log_factor=0.5), None)
    assert not due(Track(n=1, log_factor=0.5), None, final=True)
    assert due(Track(n=MIN_SAVE_N, log_factor=0.0), None)
    last = (4, 0.30, 1000.0)
    assert not due(Track(n=7, log_factor=0.30 + MIN_SAVE_SHIFT / 2, updated=1001.0), last)
    assert due(Track(n=8, log_factor=0.30), last)  # doubled
    moved = 0.30 - 1.01 * MIN_SAVE_SHIFT
    assert due(Track(n=5, log_factor=moved, updated=1000.0 + MIN_SHIFT_GAP_S), last)
    # moved as much, but soon after the last write: noisy work moves the factor with every
    # sample, and is not written at every flush for it
    assert not due(Track(n=5, log_factor=moved, updated=999.0 + MIN_SHIFT_GAP_S), last)
    assert due(Track(n=5, log_factor=0.30 + MIN_SAVE_SHIFT / 2), last, final=True)
    assert not due(Track(n=4, log_factor=0.30), last, final=True)  # unchanged
    # still in use long after its last write: written again before its KV entry expires
    assert due(Track(n=5, log_factor=0.30, updated=1000.0 + REFRESH_S), last)
    assert not due(Track(n=5, log_factor=0.30, updated=999.0 + REFRESH_S), last)


def test_tracks_are_bounded_least_recently_updated_first() -> None:
    from orchestrator.predictor.correction import Corrections

    c = Corrections(max_tracks=16)
    sizes = []
    for i in range(60):
        c.observe(f"sig{i}", "dev", 1.0, 1.5, now=float(i))
        sizes.append(len(c))
        assert c.get(f"sig{i}", "dev") is not None  # the track just observed is always kept
    assert sizes == [min(i + 1, 16) for i in range(60)]  # held up to the bound, then at it
    kept = {sig for (sig, _dev), _t in c}
    assert kept == {f"sig{i}" for i in range(60 - len(c), 60)}  # the newest ones
    # the per-signature index follows the tracks
    assert all(c.for_signature(f"sig{i}") == {} for i in range(60) if f"sig{i}" not in kept)
    assert all(c.for_signature(s)["dev"] is c.get(s, "dev") for s in kept)
    # an old track updated again is recent again
    c.observe(sorted(kept)[0], "dev", 1.0, 1.5, now=100.0)
    for i in range(60, 75):
        c.observe(f"sig{i}", "dev", 1.0, 1.5, now=float(i))
    assert c.get(sorted(kept)[0], "dev") is not None


def test_tracks_loaded_past_the_bound_keep_the_most_recently_updated() -> None:
    from orchestrator.predictor.correction import Corrections, Track

    c = Corrections(max_tracks=4)
    stamps = [7.0, 2.0, 9.0, 1.0, 5.0, 8.0, 3.0, 6.0]  # read back in key order, not time
    held = c.load([(f"s{i}", "dev", Track(n=1, updated=u)) for i, u in enumerate(stamps)])
    assert sorted(t.updated for _s, _d, t in held) == [6.0, 7.0, 8.0, 9.0]
    assert {sig for (sig, _dev), _t in c} == {"s0", "s2", "s5", "s7"}
    # the next new track drops the least recently updated of those: s7 (6.0)
    c.observe("new", "dev", 1.0, 1.5, now=10.0)
    assert c.get("s7", "dev") is None and c.get("s0", "dev") is not None


async def test_history_bookkeeping_follows_the_tracks_it_may_still_write() -> None:
    """What was written of each track is kept only while the track is held: with ever new
    task signatures it would otherwise grow without bound (the tracks themselves are)."""
    from orchestrator.infra.kvwatch import all_keys
    from orchestrator.predictor.correction import Corrections
    from orchestrator.predictor.history import History

    class Bucket:  # a stand-in for the KV bucket: this is about the bookkeeping beside it
        def __init__(self) -> None:
            self.puts = 0

        async def put(self, key: str, value: bytes) -> int:
            self.puts += 1
            return self.puts

    c = Corrections(max_tracks=16)
    h = History(js=None, corrections=c, list_keys=all_keys)
    h.kv = bucket = Bucket()
    for i in range(200):
        sig = f"s{i}"
        for k in range(3):
            c.observe(sig, "a:cpu", 1.0, 1.1, float(3 * i + k))
        h.mark(sig, "a:cpu")
        await h.flush()
        assert len(h.saved) <= 2 * c.max_tracks and len(h.held) <= 2 * c.max_tracks
    assert bucket.puts == 200  # every track was still written once it had enough samples
    assert (f"s{199}", "a:cpu") in h.saved  # the recent ones are remembered
