"""A seeded corpus of ONNX models to measure: conv nets, MLPs, transformer blocks, element-wise
chains and residual conv blocks, across sizes (needs the `dev` extra: `onnx`).

    python -m orchestrator.predictor.corpus --out out/predictor/corpus

Every model has a symbolic batch dimension. The same seed gives the same files byte for byte.
`manifest.json` lists each model with its family, split and graph features (base + per batch),
so the profiler and the trainer need no `onnx`. Splits are by model (every 10th index for
validation, two in ten for test), never by row, so test models are unseen in training.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.predictor.features import graph_features, linear_in_batch

DEFAULT_DIR = Path("out/predictor/corpus")
MAX_FLOPS_B1 = 8e7  # keeps the largest model at batch 8 near 20 ms per call on one core
FAMILIES = ("conv", "mlp", "transformer", "eltwise", "resblock")
PER_FAMILY = 26
OPSET = 17


def split_of(index: int) -> str:
    r = index % 10
    return "test" if r in (3, 7) else "val" if r == 5 else "train"


class _G:
    """A tiny graph builder over onnx.helper with seeded float32 weights."""

    def __init__(self, rng: np.random.Generator) -> None:
        from onnx import helper, numpy_helper

        self.h, self.nh, self.rng = helper, numpy_helper, rng
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.n = 0

    def name(self, p: str) -> str:
        self.n += 1
        return f"{p}{self.n}"

    def w(self, shape: Sequence[int], scale: float = 0.05) -> str:
        n = self.name("w")
        arr = (self.rng.standard_normal(tuple(shape)) * scale).astype(np.float32)
        self.inits.append(self.nh.from_array(arr, n))
        return n

    def op(self, op_type: str, inputs: Sequence[str], **attrs: Any) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(self.h.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def model(self, name: str, x_shape: Sequence[int | str], y: str) -> Any:
        from onnx import TensorProto

        graph = self.h.make_graph(
            self.nodes,
            name,
            [self.h.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
            [self.h.make_tensor_value_info(y, TensorProto.FLOAT, None)],
            self.inits,
        )
        m = self.h.make_model(
            graph, opset_imports=[self.h.make_opsetid("", OPSET)], producer_name="mars-predictor"
        )
        m.ir_version = 8
        from onnx import shape_inference

        inferred = shape_inference.infer_shapes(m).graph.output[0]
        m.graph.output[0].CopyFrom(inferred)
        return m


def build(family: str, index: int, seed: int = 0) -> Any:
    """Model `index` of `family` (an onnx.ModelProto), deterministic in (family, index, seed)."""
    salt = int(hashlib.sha256(f"{family}/{index}/{seed}".encode()).hexdigest()[:8], 16)
    rng = np.random.default_rng(salt)
    fn = _BUILDERS[family]
    return fn(rng)


def _conv(rng: np.random.Generator) -> Any:
    g = _G(rng)
    c0 = c = int(rng.choice([3, 8, 16]))
    hw0 = hw = int(rng.choice([16, 24, 32, 48]))
    x, depth = "x", int(rng.integers(1, 5))
    for i in range(depth):
        co = int(rng.choice([8, 16, 32, 48, 64]))
        k = int(rng.choice([1, 3, 3, 5]))
        x = g.op("Conv", [x, g.w((co, c, k, k)), g.w((co,))], pads=[k // 2] * 4)
        x = g.op("Relu", [x])
        if rng.random() < 0.4 and hw >= 8 and i < depth - 1:
            x = g.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
            hw //= 2
        c = co
    x = g.op("GlobalAveragePool", [x])
    x = g.op("Flatten", [x], axis=1)
    x = g.op("Gemm", [x, g.w((10, c)), g.w((10,))], transB=1)
    return g.model("conv", ["N", c0, hw0, hw0], x)


def _mlp(rng: np.random.Generator) -> Any:
    g = _G(rng)
    d0 = d = int(rng.choice([32, 64, 128, 256, 512, 1024]))
    x = "x"
    for _ in range(int(rng.integers(1, 5))):
        h = int(rng.choice([32, 64, 128, 256, 512, 1024]))
        if rng.random() < 0.5:
            x = g.op("Gemm", [x, g.w((d, h)), g.w((h,))])
        else:
            x = g.op("Add", [g.op("MatMul", [x, g.w((d, h))]), g.w((h,))])
        x = g.op(str(rng.choice(["Relu", "Relu", "Tanh", "Sigmoid"])), [x])
        d = h
    return g.model("mlp", ["N", d0], x)


def _transformer(rng: np.random.Generator) -> Any:
    """One pre-norm-free encoder block: attention (single head) + FFN, residuals, LayerNorm."""
    g = _G(rng)
    s = int(rng.choice([8, 16, 32, 64, 128]))
    d = int(rng.choice([32, 64, 128, 192]))
    f = d * int(rng.choice([2, 4]))
    x = "x"
    for _ in range(int(rng.integers(1, 3))):
        q = g.op("MatMul", [x, g.w((d, d))])
        k = g.op("MatMul", [x, g.w((d, d))])
        v = g.op("MatMul", [x, g.w((d, d))])
        kt = g.op("Transpose", [k], perm=[0, 2, 1])
        sc = g.op("Mul", [g.op("MatMul", [q, kt]), g.w((1,), 0.0)])
        a = g.op("MatMul", [g.op("Softmax", [sc], axis=-1), v])
        o = g.op("Add", [g.op("MatMul", [a, g.w((d, d))]), x])
        ln = g.op("LayerNormalization", [o, g.w((d,)), g.w((d,))], axis=-1)
        hdn = g.op("Relu", [g.op("Add", [g.op("MatMul", [ln, g.w((d, f))]), g.w((f,))])])
        y = g.op("Add", [g.op("MatMul", [hdn, g.w((f, d))]), ln])
        x = g.op("LayerNormalization", [y, g.w((d,)), g.w((d,))], axis=-1)
    return g.model("transformer", ["N", s, d], x)


def _eltwise(rng: np.random.Generator) -> Any:
    g = _G(rng)
    n = int(rng.choice([256, 1024, 4096, 16384, 65536, 262144]))
    x = "x"
    for _ in range(int(rng.integers(2, 13))):
        op = str(rng.choice(["Add", "Mul", "Relu", "Sigmoid", "Tanh", "Exp", "Sqrt", "Abs"]))
        if op in ("Add", "Mul"):
            x = g.op(op, [x, g.w((n,), 0.5)])
        elif op in ("Exp", "Sqrt"):
            x = g.op(op, [g.op("Tanh", [x]) if op == "Exp" else g.op("Abs", [x])])
        else:
            x = g.op(op, [x])
    return g.model("eltwise", ["N", n], x)


def _resblock(rng: np.random.Generator) -> Any:
    """ResNet-style: stem conv, then blocks of conv-relu-conv + skip, then a classifier."""
    g = _G(rng)
    c0 = int(rng.choice([3, 8]))
    hw = int(rng.choice([16, 24, 32]))
    c = int(rng.choice([8, 16, 24, 32]))
    x = g.op("Relu", [g.op("Conv", ["x", g.w((c, c0, 3, 3)), g.w((c,))], pads=[1] * 4)])
    for _ in range(int(rng.integers(1, 4))):
        y = g.op("Relu", [g.op("Conv", [x, g.w((c, c, 3, 3)), g.w((c,))], pads=[1] * 4)])
        y = g.op("Conv", [y, g.w((c, c, 3, 3)), g.w((c,))], pads=[1] * 4)
        x = g.op("Relu", [g.op("Add", [x, y])])
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    x = g.op("Softmax", [g.op("Gemm", [x, g.w((10, c)), g.w((10,))], transB=1)], axis=1)
    return g.model("resblock", ["N", c0, hw, hw], x)


_BUILDERS: dict[str, Callable[[np.random.Generator], Any]] = {
    "conv": _conv,
    "mlp": _mlp,
    "transformer": _transformer,
    "eltwise": _eltwise,
    "resblock": _resblock,
}


def calibration_models() -> dict[str, Any]:
    """Microbenchmarks for a device's roofline: a big MatMul (GFLOP/s), a big Add (bandwidth),
    and a one-element Add (per-call overhead)."""
    out: dict[str, Any] = {}
    for name, shape, op in (
        ("cal_matmul", [512, 512], "MatMul"),
        ("cal_stream", [1 << 22], "Add"),
        ("cal_call", [1], "Add"),
    ):
        g = _G(np.random.default_rng(1))
        w = g.w(shape)
        y = g.op(op, ["x", w])
        out[name] = g.model(name, shape, y)
    return out


def generate(out: Path, per_family: int = PER_FAMILY, seed: int = 0) -> list[dict[str, Any]]:
    """Write the corpus and its manifest; returns the manifest entries."""
    import onnx

    out.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    for fam in FAMILIES:
        idx = tries = 0
        while idx < per_family:
            m = build(fam, tries, seed)
            tries += 1
            onnx.checker.check_model(m)
            if graph_features(m, 1).flops > MAX_FLOPS_B1:
                continue  # too slow to profile many times on a small host
            name = f"{fam}_{idx:03d}"
            path = out / f"{name}.onnx"
            path.write_bytes(m.SerializeToString())
            base, per = linear_in_batch(m)
            entries.append({
                "name": name, "family": fam, "index": idx, "split": split_of(idx),
                "file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                "base": base.as_dict(), "per_batch": per.as_dict(),
            })  # fmt: skip
            idx += 1
    for name, m in calibration_models().items():
        (out / f"{name}.onnx").write_bytes(m.SerializeToString())
    (out / "manifest.json").write_text(json.dumps(entries, indent=1) + "\n", encoding="utf-8")
    return entries


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Generate the predictor's ONNX corpus.")
    p.add_argument("--out", type=Path, default=DEFAULT_DIR)
    p.add_argument("--per-family", type=int, default=PER_FAMILY)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    entries = generate(args.out, args.per_family, args.seed)
    print(f"wrote {len(entries)} models to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
