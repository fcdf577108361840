"""Build the small ONNX models shipped with the agent (run with the `dev` extra: needs `onnx`).

The weights come from a seeded generator, so the file is reproducible byte for byte:
    python tools/build_models.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = Path(__file__).resolve().parents[1] / "edge_agent" / "models"


def _init(name: str, arr: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(arr.astype(np.float32), name)


def tiny_cnn(seed: int = 7) -> onnx.ModelProto:
    """32x32 RGB -> 10 class probabilities: conv-relu-pool, conv-relu, global pool, dense."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("w1", rng.normal(0, 0.2, (16, 3, 3, 3))),
        _init("b1", np.zeros(16)),
        _init("w2", rng.normal(0, 0.1, (32, 16, 3, 3))),
        _init("b2", np.zeros(32)),
        _init("w3", rng.normal(0, 0.1, (10, 32))),
        _init("b3", np.zeros(10)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="mars-tools"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "tiny_cnn.onnx"
    path.write_bytes(tiny_cnn().SerializeToString())
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
