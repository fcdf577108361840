"""The analytical prior, scalar and vectorised, agree exactly."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.predictor.prior import estimate_matrix, estimate_seconds, estimate_vector
from schemas import DeviceSpec, TaskSpec

TASKS = [
    {"id": "a", "run": {"kind": "synthetic", "seconds": 0.3}},
    {"id": "b", "run": {"kind": "synthetic", "seconds": 0.3, "ref_gflops": 10.0}},
    {"id": "c", "run": {"kind": "onnx", "model": "m", "iterations": 7}, "profile": {"flops": 3e7}},
    {"id": "d", "run": {"kind": "exec", "argv": ["x"]}, "profile": {"est_seconds": 2.5}},
    {"id": "e", "run": {"kind": "exec", "argv": ["x"]}},
]


@pytest.mark.parametrize("raw", TASKS, ids=lambda r: r["id"])
def test_vector_matches_scalar(raw: dict[str, object]) -> None:
    task = TaskSpec.model_validate(raw)
    gflops = [0.5, 10.0, 123.4, 1e4]
    vec = estimate_vector(task, np.array(gflops))
    scalar = [
        estimate_seconds(task, DeviceSpec(device_id="d", kind="cpu", gflops=g)) for g in gflops
    ]
    assert vec.tolist() == scalar
    assert all(x > 0 for x in scalar)


def test_the_matrix_is_each_task_s_vector() -> None:
    """Tasks of every kind, mixed and repeated: each row is exactly that task's vector."""
    tasks = [TaskSpec.model_validate(raw) for raw in TASKS * 2][::-1]
    gflops = np.array([0.5, 10.0, 123.4, 1e4, 3.3])
    got = estimate_matrix(tasks, gflops)
    assert got.shape == (len(tasks), len(gflops))
    for row, task in zip(got, tasks, strict=True):
        assert row.tolist() == estimate_vector(task, gflops).tolist()
    assert estimate_matrix([], gflops).shape == (0, len(gflops))
