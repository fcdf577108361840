"""Graph features: FLOPs of known ops equal hand-computed values; batch scaling is exact."""

from __future__ import annotations

from dataclasses import fields

import pytest

from orchestrator.predictor.features import (
    FEATURE_NAMES,
    GraphFeatures,
    graph_features,
    linear_in_batch,
    shipped_book,
    task_vector,
)

onnx = pytest.importorskip("onnx")
import numpy as np  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(nodes, x_shape, inits):
    graph = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.zeros(s, np.float32), n) for n, s in inits.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_conv_flops_match_hand_computation() -> None:
    # (N,3,8,8) * (4,3,3,3) pad 1 -> (N,4,8,8): 2 * N*4*8*8 * 3*3*3 FLOPs, then a ReLU
    m = _model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])],
        ["N", 3, 8, 8],
        {"w": (4, 3, 3, 3), "b": (4,)},
    )  # fmt: skip
    g = graph_features(m, batch=2)
    assert g.conv_flops == 2 * 2 * 4 * 8 * 8 * 3 * 3 * 3
    assert g.other_flops == 2 * 4 * 8 * 8
    assert g.flops == g.conv_flops + g.other_flops
    assert (g.n_conv, g.n_elementwise, g.nodes) == (1, 1, 2)
    assert g.params == 4 * 3 * 3 * 3 + 4
    assert g.bytes_in == 4 * 2 * 3 * 8 * 8
    assert g.bytes_out == 4 * 2 * 4 * 8 * 8


def test_grouped_conv_counts_input_channels_per_group() -> None:
    m = _model(
        [helper.make_node("Conv", ["x", "w"], ["y"], group=4)],
        ["N", 8, 5, 5],
        {"w": (8, 2, 1, 1)},
    )
    assert graph_features(m, 1).conv_flops == 2 * 8 * 5 * 5 * 2


def test_matmul_and_gemm_flops() -> None:
    m = _model(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("Gemm", ["h", "v", "c"], ["y"], transB=1)],
        ["N", 16],
        {"w": (16, 32), "v": (10, 32), "c": (10,)},
    )  # fmt: skip
    g = graph_features(m, batch=3)
    assert g.matmul_flops == 2 * 3 * 16 * 32 + 2 * 3 * 32 * 10
    assert g.n_matmul == 2


def test_features_are_exactly_linear_in_batch() -> None:
    from orchestrator.predictor.corpus import build

    for fam in ("conv", "transformer", "eltwise"):
        m = build(fam, 1)
        base, per = linear_in_batch(m)
        direct = graph_features(m, 5)
        via = base.at_batch(per, 5)
        for f in fields(GraphFeatures):
            assert getattr(via, f.name) == pytest.approx(getattr(direct, f.name)), f.name


def test_shipped_book_matches_the_builtin_model() -> None:
    from edge_agent.executors import BUILTIN_MODELS

    g = shipped_book().get("tiny_cnn", 4)
    assert g is not None
    assert g == graph_features(onnx.load(str(BUILTIN_MODELS / "tiny_cnn.onnx")), 4)
    assert shipped_book().get("tiny_cnn", 1, sha256="0" * 64) is None
    assert len(task_vector(g)) + 4 == len(FEATURE_NAMES)
