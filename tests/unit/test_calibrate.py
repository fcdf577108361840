"""Calibration: the micro-benchmarks give sane figures; the drift rule and the re-check."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from edge_agent.calibrate import Recalibrator, drift_change, mem_bandwidth_gbps
from edge_agent.ortprobe import onnx_call_overhead_ms
from edge_agent.probe import _openblas, matmul_gflops
from schemas.agent import CalibrationDrift, DeviceSpec

CPU = DeviceSpec(device_id="cpu0", kind="cpu", gflops=100.0, calibrated=True)
EMULATED = DeviceSpec(device_id="npu0", kind="npu", gflops=80.0, emulated=True)
DECLARED = DeviceSpec(device_id="cpu1", kind="cpu", gflops=100.0)


@pytest.mark.parametrize(
    ("previous", "current", "expected"),
    [
        (100.0, 85.0, -0.15),  # exactly the threshold counts
        (100.0, 86.0, None),
        (100.0, 115.0, 0.15),
        (100.0, 114.9, None),
        (100.0, 40.0, -0.6),
        (100.0, 100.0, None),
        (0.0, 50.0, None),  # nothing to compare with
        (100.0, 0.0, None),
    ],
)
def test_drift_rule(previous: float, current: float, expected: float | None) -> None:
    got = drift_change(previous, current, 0.15)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def readings(*values: float) -> Iterator[float]:
    yield from values
    raise AssertionError("measured more often than expected")


def recal(values: Iterator[float]) -> Recalibrator:
    return Recalibrator("a1", "inc1", 300.0, 0.15, measure=lambda: next(values))


def test_stable_reading_is_measured_once_and_reports_nothing() -> None:
    r = recal(readings(97.0))
    assert r.recheck([CPU, EMULATED, DECLARED]) == []  # only the calibrated CPU is measured


def test_confirmed_drop_is_reported_with_the_better_of_two_readings() -> None:
    r = recal(readings(60.0, 70.0))
    ((new, notice),) = r.recheck([CPU, EMULATED])
    assert new.gflops == 70.0 and new.calibrated and new.device_id == "cpu0"
    assert notice == CalibrationDrift(
        agent_id="a1",
        incarnation="inc1",
        device_id="cpu0",
        baseline=100.0,
        previous=100.0,
        current=70.0,
        change=-0.3,
    )
    # the next check compares with the advertised 70, and keeps the start figure as baseline
    r.measure = lambda: 100.0
    ((back, notice2),) = r.recheck([new])
    assert back.gflops == 100.0 and notice2.baseline == 100.0 and notice2.previous == 70.0


def test_transient_dip_is_not_drift() -> None:
    r = recal(readings(50.0, 98.0))  # a burst of other load during the first reading
    assert r.recheck([CPU]) == []


def test_rise_must_be_confirmed_too() -> None:
    r = recal(readings(140.0, 125.0))
    ((new, notice),) = r.recheck([CPU])
    assert new.gflops == 125.0 and notice.change == pytest.approx(0.25)


def test_emulated_or_uncalibrated_devices_make_the_loop_idle() -> None:
    assert not recal(readings()).active([EMULATED, DECLARED])
    assert recal(readings()).active([CPU])
    assert not Recalibrator("a", "i", 0.0, 0.15).active([CPU])  # 0 disables


async def test_loop_reports_drift_and_skips_checks_while_busy() -> None:
    stopped = asyncio.Event()
    reported: asyncio.Future[list[tuple[DeviceSpec, CalibrationDrift]]] = (
        asyncio.get_running_loop().create_future()
    )
    busy = iter([True, True, False])
    r = Recalibrator("a1", "inc1", 0.01, 0.15, measure=lambda: 40.0)

    async def on_drift(drifted: list[tuple[DeviceSpec, CalibrationDrift]]) -> None:
        if not reported.done():
            reported.set_result(drifted)

    loop = asyncio.create_task(r.run(lambda: [CPU], lambda: next(busy, False), on_drift, stopped))
    try:
        ((new, notice),) = await asyncio.wait_for(reported, 5.0)
    finally:
        stopped.set()
        await asyncio.wait_for(loop, 5.0)
    assert new.gflops == 40.0 and notice.change == pytest.approx(-0.6)
    assert r.checks >= 1


def test_benchmarks_give_plausible_figures() -> None:
    assert mem_bandwidth_gbps(mb=8) > 0.1
    assert 0.0 < onnx_call_overhead_ms(calls=5) < 100.0
    assert onnx_call_overhead_ms("NoSuchExecutionProvider") == 0.0


def test_matmul_runs_single_threaded_and_restores_the_blas_pool() -> None:
    fns = _openblas()
    before = int(fns[1]()) if fns else None
    assert matmul_gflops(n=64, repeats=2, min_s=0.0) > 0.1
    if fns is not None:
        assert int(fns[1]()) == before
