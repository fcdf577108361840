"""Start-up micro-benchmarks of the devices this host really has, and the drift re-check.

Why: the scheduler turns work into seconds with the advertised speed, so it must be measured on
this host (not read from a datasheet) and kept honest when the host throttles. Everything here
is short: the whole start-up calibration of a CPU takes well under a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable

import numpy as np

from edge_agent.ortprobe import onnx_call_overhead_ms
from edge_agent.probe import matmul_gflops
from schemas.agent import CalibrationDrift, DeviceSpec

log = logging.getLogger("mars.agent.calibrate")

MEM_BENCH_MB = 64
#: Relative tolerance when comparing a change with the threshold (float noise at exactly 15%).
_EPS = 1e-9


def mem_bandwidth_gbps(mb: int = MEM_BENCH_MB, repeats: int = 3) -> float:
    """Copy bandwidth (bytes read + written per second, as STREAM counts it), best of
    `repeats` after one warm-up copy that faults the destination pages in."""
    n = max(1, mb * 2**20 // 8)
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * src.nbytes / max(best, 1e-9) / 1e9


def calibrate_device(
    device: DeviceSpec, call_overhead_ms: Callable[[], float] | None = None
) -> DeviceSpec:
    """Measured figures for a probed CPU; any other device is returned unchanged (its speed
    cannot be measured with numpy, and a GPU session would take seconds to start). The ONNX
    call overhead is measured here unless the caller gives a function that has it (see
    `ortprobe`: it is measured in a child process while this one runs the other benchmarks)."""
    if device.kind != "cpu" or device.emulated:
        return device
    t0 = time.perf_counter()
    gflops = matmul_gflops()
    bw = mem_bandwidth_gbps()
    if call_overhead_ms is None:
        overhead = onnx_call_overhead_ms(device.provider or "CPUExecutionProvider")
    else:
        overhead = call_overhead_ms()
    log.info(
        "calibrated %s in %.2fs: %.1f GFLOP/s, %.1f GB/s copy, %.3f ms/call",
        device.device_id,
        time.perf_counter() - t0,
        gflops,
        bw,
        overhead,
    )
    return device.model_copy(
        update={
            "gflops": round(gflops, 3),
            "mem_bandwidth_gbps": round(bw, 2),
            "call_overhead_ms": round(overhead, 4),
            "calibrated": True,
        }
    )


def drift_change(previous: float, current: float, threshold: float) -> float | None:
    """The drift rule: `current / previous - 1` when its size reaches `threshold`, else None.
    Non-positive figures never count (nothing to compare)."""
    if previous <= 0.0 or current <= 0.0:
        return None
    change = current / previous - 1.0
    return change if abs(change) >= threshold - _EPS else None


DriftHandler = Callable[[list[tuple[DeviceSpec, CalibrationDrift]]], Awaitable[None]]


class Recalibrator:
    """Re-measures the GFLOP/s of measured devices on a jittered schedule; a change of at least
    `threshold` against the advertised figure is confirmed by a second reading (a burst of other
    load must not pass for throttling) and then handed to `on_drift`."""

    def __init__(
        self,
        agent_id: str,
        incarnation: str,
        every_s: float,
        threshold: float,
        *,
        measure: Callable[[], float] = matmul_gflops,
        rng: random.Random | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.incarnation = incarnation
        self.every_s = every_s
        self.threshold = threshold
        self.measure = measure
        self.rng = rng or random.Random()
        #: Start-up figure per device id (kept for the notices).
        self.baseline: dict[str, float] = {}
        self.checks = 0

    @staticmethod
    def measurable(device: DeviceSpec) -> bool:
        return device.calibrated and not device.emulated and device.kind == "cpu"

    def active(self, devices: list[DeviceSpec]) -> bool:
        return self.every_s > 0 and any(self.measurable(d) for d in devices)

    def recheck(self, devices: list[DeviceSpec]) -> list[tuple[DeviceSpec, CalibrationDrift]]:
        """Blocking: measure each measured device once (twice if it seems to have drifted)."""
        self.checks += 1
        out: list[tuple[DeviceSpec, CalibrationDrift]] = []
        for d in devices:
            if not self.measurable(d):
                continue
            self.baseline.setdefault(d.device_id, d.gflops)
            current = self.measure()
            change = drift_change(d.gflops, current, self.threshold)
            if change is None:
                continue
            again = self.measure()
            current = max(current, again) if change < 0 else min(current, again)
            change = drift_change(d.gflops, current, self.threshold)
            if change is None:
                continue
            new = d.model_copy(update={"gflops": round(current, 3)})
            notice = CalibrationDrift(
                agent_id=self.agent_id,
                incarnation=self.incarnation,
                device_id=d.device_id,
                baseline=self.baseline[d.device_id],
                previous=d.gflops,
                current=new.gflops,
                change=round(change, 4),
            )
            out.append((new, notice))
        return out

    async def run(
        self,
        devices: Callable[[], list[DeviceSpec]],
        busy: Callable[[], bool],
        on_drift: DriftHandler,
        stopped: asyncio.Event,
    ) -> None:
        """Loop until `stopped`; skips a check while tasks run (they would skew the reading)."""
        for d in devices():
            if self.measurable(d):
                self.baseline.setdefault(d.device_id, d.gflops)
        while not stopped.is_set():
            delay = self.every_s * self.rng.uniform(0.9, 1.1)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), delay)
            if stopped.is_set():
                return
            if busy():
                continue
            drifted = await asyncio.to_thread(self.recheck, devices())
            for _, notice in drifted:
                log.warning(
                    "calibration drift on %s: %.1f -> %.1f GFLOP/s (%+.0f%%, start %.1f)",
                    notice.device_id,
                    notice.previous,
                    notice.current,
                    notice.change * 100,
                    notice.baseline,
                )
            if drifted:
                try:
                    await on_drift(drifted)
                except Exception as exc:  # e.g. disconnected: the next advert carries it
                    log.info("reporting drift failed: %s", exc)
