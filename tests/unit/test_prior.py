"""The analytical prior, scalar and by the matrix, agree exactly."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.predictor.prior import estimate_matrix, estimate_seconds
from schemas import DeviceSpec, TaskSpec

TASKS = [
    {"id": "a", "run": {"kind": "synthetic", "seconds": 0.3}},
    {"id": "b", "run": {"kind": "synthetic", "seconds": 0.3, "ref_gflops": 10.0}},
    {"id": "c", "run": {"kind": "onnx", "model": "m", "iterations": 7}, "profile": {"flops": 3e7}},
    {"id": "d", "run": {"kind": "exec", "argv": ["x"]}, "profile": {"est_seconds": 2.5}},
    {"id": "e", "run": {"kind": "exec", "argv": ["x"]}},
]


@pytest.mark.parametrize("raw", TASKS, ids=lambda r: r["id"])
def test_each_row_is_the_scalar_prior(raw: dict[str, object]) -> None:
    task = TaskSpec.model_validate(raw)
    gflops = [0.5, 10.0, 123.4, 1e4]
    got, declared = estimate_matrix([task], np.array(gflops))
    scalar = [
        estimate_seconds(task, DeviceSpec(device_id="d", kind="cpu", gflops=g)) for g in gflops
    ]
    assert got[0].tolist() == scalar
    assert all(x > 0 for x in scalar)
    # declared: the task states its own time (synthetic, or an estimate without FLOPs)
    assert bool(declared[0]) == (raw["id"] in {"a", "b", "d"})


def test_tasks_of_every_kind_mixed_keep_their_own_rows() -> None:
    """Mixed and repeated, grouped by kind inside: each row is still exactly its task's."""
    tasks = [TaskSpec.model_validate(raw) for raw in TASKS * 2][::-1]
    gflops = [0.5, 10.0, 123.4, 1e4, 3.3]
    got, declared = estimate_matrix(tasks, np.array(gflops))
    assert got.shape == (len(tasks), len(gflops)) and declared.shape == (len(tasks),)
    for row, task in zip(got, tasks, strict=True):
        assert row.tolist() == [
            estimate_seconds(task, DeviceSpec(device_id="d", kind="cpu", gflops=g)) for g in gflops
        ]
    empty, none = estimate_matrix([], np.array(gflops))
    assert empty.shape == (0, len(gflops)) and none.shape == (0,)
