"""Contention kept apart: an agent says on a run's end event how many other jobs it ran at the
same time (`TaskEvent.shared`, from wire level 7); a run that shared its agent enters neither
the warm (uncontended) history nor the factor, and its ratio to the uncontended estimate is
kept apart per track (`Track.contention`, `Predictor.contention`)."""

from __future__ import annotations

import json

import msgpack
import pytest

from edge_agent.core import Overlaps
from orchestrator.predictor.correction import CONTENDED_WINDOW, Corrections, Track
from orchestrator.predictor.history import due, seen
from orchestrator.predictor.model import Predictor
from schemas import DeviceSpec, TaskSpec
from schemas.codec import Encoding, decode, encode
from schemas.events import TaskEvent
from schemas.predictor import CorrectionRecord, CorrectionTrack
from schemas.wire import ADDED


def warmed(c: Corrections, runs: tuple[float, ...] = (1.0, 1.02, 1.0)) -> Track:
    for x in runs:
        assert c.observe("s", "d", 0.5, x, 1.0, cold=False, shared=0)
    t = c.get("s", "d")
    assert t is not None and t.warm_s == 1.0
    return t


def test_a_contended_run_leaves_the_warm_estimate_and_the_factor_as_they_were() -> None:
    c = Corrections()
    t = warmed(c)
    before = (t.warm, t.warm_s, t.log_factor, t.n, t.recent, t.pending, t.rejected)
    assert c.observe("s", "d", 0.5, 1.8, 2.0, cold=False, shared=1)
    assert c.observe("s", "d", 0.5, 2.4, 3.0, shared=3)
    assert (t.warm, t.warm_s, t.log_factor, t.n, t.recent, t.pending, t.rejected) == before
    assert t.seconds(0.5) == 1.0
    assert (t.contended, t.contended_n, t.updated) == ((1.8, 2.4), 2, 3.0)
    assert t.contention == pytest.approx(2.1)
    # a run alone still moves it
    assert c.observe("s", "d", 0.5, 1.01, 4.0, shared=0)
    assert t.warm == (1.0, 1.02, 1.0, 1.01)


def test_before_a_history_contention_is_against_the_model_times_its_factor() -> None:
    c = Corrections()
    assert c.observe("s", "d", 2.0, 3.0, 1.0, cold=False)  # factor 1.5, no history yet
    t = c.get("s", "d")
    assert t is not None and t.warm_s == 0.0 and t.factor == pytest.approx(1.5)
    assert c.observe("s", "d", 2.0, 6.0, 2.0, cold=False, shared=2)
    assert t.factor == pytest.approx(1.5) and t.warm == (3.0,)
    assert t.contended == pytest.approx((2.0,)) and t.contention == pytest.approx(2.0)


def test_the_contention_figure_is_the_median_of_a_window_and_counts_every_run() -> None:
    c = Corrections()
    t = warmed(c)
    ratios = [1.0 + 0.1 * i for i in range(CONTENDED_WINDOW + 4)]
    for r in ratios:
        c.observe("s", "d", 0.5, r, 2.0, shared=1)
    assert t.contended_n == CONTENDED_WINDOW + 4
    assert t.contended == pytest.approx(tuple(ratios[-CONTENDED_WINDOW:]))
    kept = ratios[-CONTENDED_WINDOW:]
    assert t.contention == pytest.approx((kept[7] + kept[8]) / 2)
    assert Track().contention is None


def test_an_old_agent_saying_nothing_counts_as_unshared() -> None:
    c = Corrections()
    t = warmed(c)
    assert c.observe("s", "d", 0.5, 1.0, 2.0, shared=None)
    assert (t.warm, t.contended, t.contended_n) == ((1.0, 1.02, 1.0, 1.0), (), 0)


def test_a_cold_run_that_shared_its_agent_is_kept_with_the_cold_runs() -> None:
    c = Corrections()
    assert c.observe("s", "d", 0.5, 4.0, 1.0, cold=True, load_s=0.2, shared=1)
    t = c.get("s", "d")
    assert t is not None
    assert (t.cold_n, t.warm, t.contended_n, t.n) == (1, (), 0, 0)


def test_a_record_written_before_contention_still_loads() -> None:
    """A level-7 record of the shape before this field (history, cold runs; no contention)
    reads, and its track has seen no contended run."""
    old = {
        "sig": "abc",
        "device": "a:cpu",
        "track": {"log_factor": 0.5, "n": 4, "recent": [0.5, 0.5, 0.49, 0.51], "pending": [],
                  "rejected": 0, "updated": 12.0, "warm": [1.0, 1.0, 1.1], "warm_s": 1.0,
                  "cold_n": 1, "cold_s": 3.0, "load_s": 0.2},
        "by": "orch-1",
    }  # fmt: skip
    rec = CorrectionRecord.model_validate(old)
    t = Track(**rec.track.model_dump())
    assert (t.contended, t.contended_n, t.contention, t.warm_s) == ((), 0, None, 1.0)


def test_a_track_with_contention_round_trips_through_its_record() -> None:
    c = Corrections()
    t = warmed(c)
    c.observe("s", "d", 0.5, 1.5, 2.0, shared=1)
    c.observe("s", "d", 0.5, 1.7, 3.0, shared=1)
    back = Track(**CorrectionTrack(**t.to_dict()).model_dump())
    assert back == t and back.contended == (1.5, 1.7) and back.contended_n == 2
    assert ADDED[CorrectionTrack]["contended"] == ADDED[CorrectionTrack]["contended_n"] == 7
    with pytest.raises(ValueError):
        CorrectionTrack(contended=[0.0])


def test_contended_runs_make_a_track_due_for_a_write() -> None:
    """At stop a track whose only change is contended runs is written; their count joins the
    doubling rule."""
    c = Corrections()
    t = warmed(c)
    last = (seen(t), t.level, t.updated)
    assert not due(t, last, final=True)
    c.observe("s", "d", 0.5, 1.6, 2.0, shared=1)
    assert seen(t) == t.n + 1 and due(t, last, final=True)
    for _ in range(2):
        c.observe("s", "d", 0.5, 1.6, 3.0, shared=1)
    assert seen(t) == 2 * last[0] and due(t, last)


CPU = DeviceSpec(device_id="cpu", kind="cpu", gflops=80.0, mem_bandwidth_gbps=12.0,
                 call_overhead_ms=0.09, calibrated=True)  # fmt: skip


def test_the_predictor_says_contention_apart_from_its_estimate() -> None:
    p = Predictor(model=None)
    t = TaskSpec.model_validate(
        {"id": "t", "run": {"kind": "onnx", "model": "some_model", "batch": 1}}
    )
    base = float(p.estimate([t], [CPU], ["a:cpu"]).base[0, 0])
    for x in (2.0, 2.1, 2.0):  # lower quartile 2.0
        p.observe(t, "a:cpu", CPU, x * base, 1.0, cold=False, shared=0)
    assert p.contention(t, "a:cpu") is None
    assert p.estimate([t], [CPU], ["a:cpu"]).seconds[0, 0] == pytest.approx(2.0 * base)
    assert p.observe(t, "a:cpu", CPU, 3.0 * base, 2.0, shared=1) is not None
    assert p.observe(t, "a:cpu", CPU, 5.0 * base, 3.0, shared=2) is not None
    assert p.estimate([t], [CPU], ["a:cpu"]).seconds[0, 0] == pytest.approx(2.0 * base)
    assert p.contention(t, "a:cpu") == pytest.approx((1.5 + 2.5) / 2)
    assert p.contention(t, "b:cpu") is None


def test_an_agent_counts_the_most_other_jobs_each_ran_with() -> None:
    a, b, c, d = (object() for _ in range(4))
    o = Overlaps()
    o.begin(a)
    o.begin(b)
    assert o.end(b) == 1
    o.begin(c)
    o.begin(d)
    assert o.end(c) == 2
    assert o.end(d) == 2
    assert o.end(a) == 2
    assert len(o) == 0 and o.end(a) == 0
    o.begin(a)
    assert o.end(a) == 0  # alone


def _event(**kw: object) -> TaskEvent:
    return TaskEvent.model_validate(
        {"event_id": "e", "pipeline_id": "p", "task_id": "t", "agent_id": "a",
         "incarnation": "i", "device_id": "cpu0", "token": 1, "state": "succeeded",
         "duration_s": 0.04, **kw}
    )  # fmt: skip


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_shared_goes_from_level_7_and_is_left_out_below(encoding: Encoding) -> None:
    assert ADDED[TaskEvent]["shared"] == 7
    ev = _event(shared=2, cold=False, load_s=0.0)

    def fields(data: bytes) -> dict[str, object]:
        out = json.loads(data) if encoding == "json" else msgpack.unpackb(data)
        assert isinstance(out, dict)
        return out

    assert fields(encode(ev, encoding))["shared"] == 2
    old = fields(encode(ev, encoding, level=6))
    assert "shared" not in old and old["duration_s"] == 0.04
    back = decode(encode(ev, encoding, level=6), TaskEvent, encoding)
    assert back.shared is None
    assert decode(encode(ev, encoding), TaskEvent, encoding) == ev
    with pytest.raises(ValueError):
        _event(shared=-1)
