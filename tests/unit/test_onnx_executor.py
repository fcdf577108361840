"""ONNX runs have a time limit and stop when cancelled, with the real ONNX Runtime: a thread
cannot be killed, so a run past its limit, or withdrawn, is terminated inside ONNX Runtime
(`RunOptions.terminate`), not left computing after its slot was freed."""

from __future__ import annotations

import asyncio
import re

import pytest

from edge_agent.executors import ExecutionError, OnnxExecutor
from schemas.agent import DeviceSpec
from schemas.pipeline import OnnxRun

CPU = DeviceSpec(device_id="cpu0", kind="cpu", slots=1)


def long_run(timeout_s: float = 60.0) -> OnnxRun:
    """Far more work than any limit below: it ends early only if it is terminated."""
    return OnnxRun(model="tiny_cnn", batch=64, iterations=10_000, timeout_s=timeout_s)


async def test_a_run_within_its_limit_completes() -> None:
    ex = OnnxExecutor()
    out = await ex.run(OnnxRun(model="tiny_cnn", iterations=2, timeout_s=60.0), CPU)
    assert out.result.startswith("top1=class")
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
