"""History first: per (task, device) the warm runs' robust centre is the estimate once there
are a few; cold runs (a session made for the run) are kept apart and never pull it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.predictor.correction import (
    HISTORY_MIN,
    WARM_WINDOW,
    Corrections,
    Track,
    robust_centre,
)
from orchestrator.predictor.history import due
from orchestrator.predictor.model import HISTORY, PRIOR, SOURCES, Predictor
from schemas import DeviceSpec, TaskSpec
from schemas.predictor import CorrectionRecord, CorrectionTrack

noise = st.lists(st.floats(min_value=-0.02, max_value=0.02), min_size=4, max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    base=st.floats(min_value=1e-5, max_value=100.0),
    ratio=st.floats(min_value=0.02, max_value=50.0),
    slow=st.floats(min_value=1.2, max_value=36.0),
    eps=noise,
    flagged=st.booleans(),
)
def test_a_cold_first_run_then_warm_runs_lands_within_5_percent(
    base: float, ratio: float, slow: float, eps: list[float], flagged: bool
) -> None:
    """The case that kept the factor away from the warm time: a first run many times slower.
    Said cold, it stays out of the history; not said (an older agent), the history's outlier
    rule leaves it out. Either way five runs land within 5 % of the warm time."""
    c = Corrections()
    warm = base * ratio
    c.observe("s", "d", base, warm * slow, 0.0, cold=True if flagged else None, load_s=0.3)
    for e in eps:
        c.observe("s", "d", base, warm * (1.0 + e), 1.0, cold=False if flagged else None)
    t = c.get("s", "d")
    assert t is not None
    assert abs(t.seconds(base) - warm) / warm <= 0.05
    assert t.warm_s == t.seconds(base)  # the history's, not the factor's


def test_cold_runs_are_kept_apart_with_their_load() -> None:
    c = Corrections()
    assert c.observe("s", "d", 1.0, 5.0, 1.0, cold=True, load_s=0.4)
    assert c.observe("s", "d", 1.0, 7.0, 2.0, cold=True, load_s=0.6)
    t = c.get("s", "d")
    assert t is not None
    assert (t.n, t.warm, t.warm_s, t.log_factor) == (0, (), 0.0, 0.0)
    assert t.cold_n == 2 and t.cold_s == pytest.approx(6.0) and t.load_s == pytest.approx(0.5)
    assert t.updated == 2.0


def test_before_enough_warm_runs_the_model_times_its_factor_stands() -> None:
    c = Corrections()
    for i in range(HISTORY_MIN - 1):
        c.observe("s", "d", 1.0, 2.0, float(i), cold=False)
        t = c.get("s", "d")
        assert t is not None and t.warm_s == 0.0
        assert t.seconds(3.0) == pytest.approx(3.0 * t.factor)
    c.observe("s", "d", 1.0, 2.0, 9.0, cold=False)
    t = c.get("s", "d")
    assert t is not None and t.warm_s == 2.0 and t.seconds(3.0) == 2.0


def test_an_outlier_does_not_move_the_history() -> None:
    c = Corrections()
    runs = [0.100, 0.101, 0.099, 0.100, 0.102]
    for x in runs:
        c.observe("s", "d", 1.0, x, 0.0)
    t = c.get("s", "d")
    assert t is not None and t.warm_s == 0.100
    for spike in (0.5, 0.02, 3.0):  # one at a time, between ordinary runs
        c.observe("s", "d", 1.0, spike, 0.0)
        assert t.warm_s == 0.100
        c.observe("s", "d", 1.0, 0.100, 0.0)
        assert t.warm_s == 0.100


def test_a_consistent_shift_restarts_the_history() -> None:
    c = Corrections()
    for _ in range(8):
        c.observe("s", "d", 1.0, 0.100, 0.0)
    c.observe("s", "d", 1.0, 0.200, 0.0)
    c.observe("s", "d", 1.0, 0.201, 0.0)
    t = c.get("s", "d")
    assert t is not None and t.warm_s == 0.100  # two slow runs are noise ...
    c.observe("s", "d", 1.0, 0.202, 0.0)
    # ... three the new speed (their lower quartile)
    assert t.warm == (0.200, 0.201, 0.202) and t.warm_s == pytest.approx(0.2005)


def test_the_history_keeps_a_window_of_warm_runs() -> None:
    c = Corrections()
    for i in range(WARM_WINDOW + 5):
        c.observe("s", "d", 1.0, 1.0 + 0.001 * (i % 5), 0.0)
    t = c.get("s", "d")
    assert t is not None and len(t.warm) == WARM_WINDOW


def test_the_robust_centre_is_the_lower_quartile_of_the_runs_near_the_median() -> None:
    assert robust_centre([1.0, 1.02, 0.98]) == pytest.approx(0.99)
    # 9.0 is cut; of 0.98, 1.0, 1.01, 1.02 the lower quartile (inclusive) is 0.995
    assert robust_centre([1.0, 1.02, 0.98, 1.01, 9.0]) == pytest.approx(0.995)
    # spread wider than the floor: the bound follows it, nothing of the spread is cut
    wide = [0.6, 0.8, 1.0, 1.25, 1.6]
    assert robust_centre(wide) == pytest.approx(0.8)
    # one slow run among steady ones (a busy host) does not move it
    assert robust_centre([1.0, 1.0, 1.0, 1.3]) == pytest.approx(1.0)


def test_a_track_written_before_history_first_still_loads() -> None:
    """A record of the earlier shape (no warm history, no cold runs) reads, and its track
    goes on from its factor until warm runs come."""
    old = {
        "sig": "abc",
        "device": "a:cpu",
        "track": {"log_factor": 0.5, "n": 4, "recent": [0.5, 0.5, 0.49, 0.51], "pending": [],
                  "rejected": 0, "updated": 12.0},
        "by": "orch-1",
    }  # fmt: skip
    rec = CorrectionRecord.model_validate(old)
    t = Track(**rec.track.model_dump())
    assert (t.warm, t.warm_s, t.cold_n, t.cold_s, t.load_s) == ((), 0.0, 0, 0.0, 0.0)
    assert t.seconds(2.0) == pytest.approx(2.0 * math.exp(0.5))
    assert t.level == 0.5


def test_a_track_with_history_round_trips_through_its_record() -> None:
    c = Corrections()
    c.observe("s", "d", 1.0, 3.0, 1.0, cold=True, load_s=0.25)
    for x in (1.0, 1.01, 1.0, 1.0):  # lower quartile 1.0
        c.observe("s", "d", 1.0, x, 2.0, cold=False)
    t = c.get("s", "d")
    assert t is not None
    back = Track(**CorrectionTrack(**t.to_dict()).model_dump())
    assert back == t and back.warm_s == 1.0 and back.level == 0.0


def test_a_record_is_written_when_its_history_moves() -> None:
    last = (8, 0.0, 0.0)
    moved = Track(n=9, warm=(1.2, 1.2, 1.2), updated=1e6)
    assert moved.level == pytest.approx(math.log(1.2))
    assert due(moved, last)
    assert not due(Track(n=9, warm=(1.0, 1.0, 1.0), updated=1e3), last)


CPU = DeviceSpec(device_id="cpu", kind="cpu", gflops=80.0, mem_bandwidth_gbps=12.0,
                 call_overhead_ms=0.09, calibrated=True)  # fmt: skip


def test_the_predictor_answers_from_the_history_and_says_so() -> None:
    p = Predictor(model=None)
    t = TaskSpec.model_validate(
        {"id": "t", "run": {"kind": "onnx", "model": "some_model", "batch": 1}}
    )
    before = p.estimate([t], [CPU], ["a:cpu"])
    assert before.source_name(0, 0) == SOURCES[PRIOR]
    base = float(before.base[0, 0])
    p.observe(t, "a:cpu", CPU, 40 * base, 0.0, cold=True, load_s=0.05)
    assert p.estimate([t], [CPU], ["a:cpu"]).seconds[0, 0] == pytest.approx(base)
    assert p.load_estimate(t, "a:cpu") == pytest.approx(0.05)
    for x in (3.0, 3.1, 3.0):  # lower quartile 3.0
        p.observe(t, "a:cpu", CPU, x * base, 1.0, cold=False)
    e = p.estimate([t], [CPU], ["a:cpu", "b:cpu"][:1])
    assert e.seconds[0, 0] == pytest.approx(3.0 * base)
    assert e.source[0, 0] == HISTORY and e.source_name(0, 0) == "history"
    assert e.base[0, 0] == pytest.approx(base)
    other = p.estimate([t], [CPU], ["b:cpu"])  # another device: nothing learned there
    assert other.seconds[0, 0] == pytest.approx(base) and p.load_estimate(t, "b:cpu") is None
