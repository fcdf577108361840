"""Analytical prior: what a task should take on a device before anything was measured.

Synthetic tasks state their own time (scaled by speed when they name a reference); other tasks
use a roofline-style estimate from their declared FLOPs, or their declared estimate.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def estimate_matrix(
    tasks: Sequence[TaskSpec], gflops: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """`estimate_seconds` of each task (a row) on devices of these `gflops` (the same
    arithmetic in the same order, a kind of task at a time: every plan prices every task on
    every device), and which rows are declared by the task itself rather than guessed."""
    out = np.empty((len(tasks), len(gflops)))
    declared = np.zeros(len(tasks), dtype=bool)
    const: list[tuple[int, float]] = []
    scaled: list[tuple[int, float]] = []  # seconds x ref_gflops, over each device's gflops
    roof: list[tuple[int, int, float]] = []  # iterations x (flops / (gflops x 1e9) + overhead)
    for i, task in enumerate(tasks):
        run = task.run
        if isinstance(run, SyntheticRun):
            declared[i] = True
            if run.ref_gflops is None:
                const.append((i, run.seconds))
            else:
                scaled.append((i, run.seconds * run.ref_gflops))
            continue
        prof = task.profile
        if prof.flops > 0:
            roof.append((i, run.iterations if isinstance(run, OnnxRun) else 1, prof.flops))
        elif prof.est_seconds is not None:
            declared[i] = True
            const.append((i, prof.est_seconds))
        else:
            const.append((i, DEFAULT_S))
    if const:
        rows, vals = zip(*const, strict=True)
        out[list(rows)] = np.asarray(vals)[:, None]
    if scaled:
        rows, vals = zip(*scaled, strict=True)
        out[list(rows)] = np.asarray(vals)[:, None] / gflops
    if roof:
        rows, iters, flops = zip(*roof, strict=True)
        per = np.asarray(flops)[:, None] / (gflops * 1e9) + CALL_OVERHEAD_S
        out[list(rows)] = np.asarray(iters, dtype=np.float64)[:, None] * per
    return out, declared
