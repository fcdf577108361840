"""ONNX runs have a time limit and stop when cancelled, with the real ONNX Runtime: a thread
cannot be killed, so a run past its limit, or withdrawn, is terminated inside ONNX Runtime
(`RunOptions.terminate`), not left computing after its slot was freed."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from edge_agent import values
from edge_agent.executors import ExecutionError, OnnxExecutor
from schemas.agent import DeviceSpec
from schemas.pipeline import OnnxRun

CPU = DeviceSpec(device_id="cpu0", kind="cpu", slots=1)


def long_run(timeout_s: float = 60.0) -> OnnxRun:
    """Far more work than any limit below: it ends early only if it is terminated."""
    return OnnxRun(
        model="tiny_cnn", batch=64, iterations=10_000, timeout_s=timeout_s, random_inputs=True
    )


async def test_a_run_within_its_limit_completes() -> None:
    ex = OnnxExecutor()
    run = OnnxRun(model="tiny_cnn", iterations=2, timeout_s=60.0, random_inputs=True)
    out = await ex.run(run, CPU)
    assert out.media_type == "application/x-npy" and out.data.startswith(b"\x93NUMPY")
    assert (ex.in_flight, ex.terminated) == (0, 0)


@pytest.mark.parametrize(("own", "cap"), [(0.05, 60.0), (60.0, 0.05)])
async def test_a_run_past_its_limit_is_terminated(own: float, cap: float) -> None:
    """The task's own `timeout_s`, or the agent's cap when shorter."""
    ex = OnnxExecutor()
    with pytest.raises(ExecutionError) as err:
        await ex.run(long_run(own), CPU, timeout_s=cap)
    msg = str(err.value)
    assert "exceeded its 0.05 s limit" in msg
    done = re.search(r"terminated after (\d+) of 10000 iterations", msg)
    assert done is not None and int(done[1]) < 10_000, msg
    assert (ex.in_flight, ex.terminated) == (0, 1)  # its thread has returned


async def test_a_cancelled_run_stops_its_thread() -> None:
    ex = OnnxExecutor()
    task = asyncio.create_task(ex.run(long_run(), CPU))
    await asyncio.sleep(0)  # the run begins (its thread may or may not have started)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (ex.in_flight, ex.terminated) == (0, 1)  # stopped, not left computing


def _pixels(n: int, dtype: type = np.float32) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((n, 3, 32, 32)).astype(dtype)


async def test_a_model_runs_on_the_tensor_bound_to_its_input() -> None:
    ex = OnnxExecutor()
    x = _pixels(3)
    out = await ex.run(OnnxRun(model="tiny_cnn"), CPU, inputs={"x": x})
    probs = values.decode(out.data)
    assert out.media_type == values.NPY and probs.shape == (3, 10)
    again = await ex.run(OnnxRun(model="tiny_cnn"), CPU, inputs={"upstream": x})  # its only one
    assert np.array_equal(values.decode(again.data), probs)  # the same input, the same output


async def test_a_tensor_of_the_wrong_type_or_shape_or_none_is_a_clear_error() -> None:
    ex = OnnxExecutor()
    with pytest.raises(ExecutionError, match=r"takes tensor\(float\).*bound to it is float64"):
        await ex.run(OnnxRun(model="tiny_cnn"), CPU, inputs={"x": _pixels(2, np.float64)})
    with pytest.raises(ExecutionError, match=r"takes shape \['N', 3, 32, 32\].*\[2, 3, 16, 16\]"):
        await ex.run(
            OnnxRun(model="tiny_cnn"), CPU, inputs={"x": np.zeros((2, 3, 16, 16), np.float32)}
        )
    with pytest.raises(ExecutionError, match="has no value bound to it"):
        await ex.run(OnnxRun(model="tiny_cnn"), CPU)
    with pytest.raises(ExecutionError, match="given a bytes"):
        await ex.run(OnnxRun(model="tiny_cnn"), CPU, inputs={"x": b"raw"})
