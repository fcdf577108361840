"""What an ONNX run reports is what the predictor predicts: the model runs' time alone, the
model's load and session creation said apart, and whether the session was made for the run;
on the wire from level 7, left out for an older peer."""

from __future__ import annotations

import json
import time

import msgpack
import pytest

from edge_agent.executors import OnnxExecutor, Output
from schemas.agent import DeviceSpec
from schemas.codec import Encoding, decode, encode
from schemas.events import TaskEvent
from schemas.pipeline import OnnxRun
from schemas.wire import ADDED, WIRE_LEVEL

CPU = DeviceSpec(device_id="cpu0", kind="cpu", slots=1)


async def test_the_first_run_is_cold_with_its_load_apart_and_later_ones_warm() -> None:
    ex = OnnxExecutor()
    run = OnnxRun(model="tiny_cnn", batch=4, iterations=3, random_inputs=True)
    t0 = time.perf_counter()
    first = await ex.run(run, CPU)
    wall = time.perf_counter() - t0
    assert first.cold is True
    assert first.load_s is not None and first.load_s > 0.0
    assert first.run_s is not None and first.run_s > 0.0
    assert first.load_s + first.run_s < wall  # each timed inside the run's wall time
    for _ in range(2):
        again = await ex.run(run, CPU)
        assert (again.cold, again.load_s) == (False, 0.0)
        assert again.run_s is not None and again.run_s > 0.0


async def test_a_session_made_again_after_its_model_is_forgotten_is_cold_again() -> None:
    ex = OnnxExecutor()
    run = OnnxRun(model="tiny_cnn", random_inputs=True)
    assert (await ex.run(run, CPU)).cold is True
    path = ex.model_path("tiny_cnn")
    assert path is not None
    ex.forget(path)
    assert (await ex.run(run, CPU)).cold is True


def test_other_executors_say_nothing_of_it() -> None:
    out = Output(b"x", "r")
    assert (out.run_s, out.load_s, out.cold) == (None, None, None)


def _event(**kw: object) -> TaskEvent:
    return TaskEvent.model_validate(
        {"event_id": "e", "pipeline_id": "p", "task_id": "t", "agent_id": "a",
         "incarnation": "i", "device_id": "cpu0", "token": 1, "state": "succeeded",
         "duration_s": 0.04, **kw}
    )  # fmt: skip


def _fields(data: bytes, encoding: Encoding) -> dict[str, object]:
    out = json.loads(data) if encoding == "json" else msgpack.unpackb(data)
    assert isinstance(out, dict)
    return out


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_load_and_cold_go_from_level_7_and_are_left_out_below(encoding: Encoding) -> None:
    assert WIRE_LEVEL >= 7 and ADDED[TaskEvent]["load_s"] == ADDED[TaskEvent]["cold"] == 7
    ev = _event(load_s=0.25, cold=True)
    new = _fields(encode(ev, encoding), encoding)
    assert (new["load_s"], new["cold"], new["duration_s"]) == (0.25, True, 0.04)
    old = _fields(encode(ev, encoding, level=6), encoding)
    assert "load_s" not in old and "cold" not in old and old["duration_s"] == 0.04
    # what an older agent sends still reads, saying nothing of either
    back = decode(encode(ev, encoding, level=6), TaskEvent, encoding)
    assert (back.load_s, back.cold) == (None, None)
    assert decode(encode(ev, encoding), TaskEvent, encoding) == ev


def test_a_negative_load_is_refused() -> None:
    with pytest.raises(ValueError):
        _event(load_s=-1.0)
