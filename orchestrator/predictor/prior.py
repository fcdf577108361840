"""Analytical prior: what a task should take on a device before anything was measured.

Synthetic tasks state their own time (scaled by speed when they name a reference); other tasks
use a roofline-style estimate from their declared FLOPs, or their declared estimate.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from schemas.agent import DeviceSpec
from schemas.pipeline import OnnxRun, SyntheticRun, TaskSpec

CALL_OVERHEAD_S = 0.0005
DEFAULT_S = 0.05


def estimate_seconds(task: TaskSpec, device: DeviceSpec) -> float:
    run = task.run
    if isinstance(run, SyntheticRun):
        if run.ref_gflops is None:
            return run.seconds
        return run.seconds * run.ref_gflops / device.gflops
    prof = task.profile
    if prof.flops > 0:
        iterations = run.iterations if isinstance(run, OnnxRun) else 1
        return iterations * (prof.flops / (device.gflops * 1e9) + CALL_OVERHEAD_S)
    if prof.est_seconds is not None:
        return prof.est_seconds
    return DEFAULT_S


def estimate_vector(task: TaskSpec, gflops: NDArray[np.float64]) -> NDArray[np.float64]:
    """`estimate_seconds` of one task on many devices at once (same arithmetic, same order)."""
    run = task.run
    if isinstance(run, SyntheticRun):
        if run.ref_gflops is None:
            return np.full(len(gflops), run.seconds, dtype=np.float64)
        out: NDArray[np.float64] = run.seconds * run.ref_gflops / gflops
        return out
    prof = task.profile
    if prof.flops > 0:
        iterations = run.iterations if isinstance(run, OnnxRun) else 1
        per: NDArray[np.float64] = iterations * (prof.flops / (gflops * 1e9) + CALL_OVERHEAD_S)
        return per
    if prof.est_seconds is not None:
        return np.full(len(gflops), prof.est_seconds, dtype=np.float64)
    return np.full(len(gflops), DEFAULT_S, dtype=np.float64)
