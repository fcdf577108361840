"""Train the handwritten-digits classifier shipped with the agent and export it to ONNX.

    python tools/train_digits.py               # writes edge_agent/models/digits.onnx + card
    python tools/train_digits.py --out DIR     # the same files into DIR

Needs the `dev` (or `test`) extra for `onnx`. The data is the shipped UCI digits set
(`edge_agent/data/digits/`), cut by `edge_agent.digits.split` into a train part (80%) and a
held-out test part that training never sees. The model is a one-hidden-layer MLP
(64 -> 32 ReLU -> 10) trained by full-batch gradient descent with momentum on cross-entropy, in
float64 numpy from a seeded initialisation: no randomness beyond the seeds below, so a rerun
gives the same weights. The exported graph takes `pixels` (float32 [N, 64], as
`edge_agent.digits.preprocess` makes them) and gives `probabilities` (float32 [N, 10]) and
`label` (int64 [N]). The card next to it (`digits.card.json`) states the data, the split, the
held-out accuracy measured with ONNX Runtime on the written file, and the file's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from numpy.typing import NDArray
from onnx import TensorProto, helper, numpy_helper

from edge_agent import digits

OUT = Path(__file__).resolve().parents[1] / "edge_agent" / "models"
MODEL_NAME = "digits.onnx"
CARD_NAME = "digits.card.json"
HIDDEN = 32
INIT_SEED = 0
EPOCHS = 500
LEARNING_RATE = 0.2
MOMENTUM = 0.9
L2 = 1e-4
F64 = NDArray[np.float64]


@dataclass(frozen=True)
class Mlp:
    w1: F64  # [64, HIDDEN]
    b1: F64
    w2: F64  # [HIDDEN, 10]
    b2: F64

    def logits(self, x: NDArray[Any]) -> NDArray[Any]:
        h = np.maximum(x @ self.w1 + self.b1, 0.0)
        out: NDArray[Any] = h @ self.w2 + self.b2
        return out


def train_mlp(x: F64, y: NDArray[np.int64]) -> Mlp:
    """Full-batch gradient descent with momentum on mean cross-entropy plus L2 on weights."""
    rng = np.random.default_rng(INIT_SEED)
    n, f = x.shape
    onehot = np.eye(digits.CLASSES)[y]
    params = [
        rng.normal(0.0, np.sqrt(2.0 / f), (f, HIDDEN)),
        np.zeros(HIDDEN),
        rng.normal(0.0, np.sqrt(1.0 / HIDDEN), (HIDDEN, digits.CLASSES)),
        np.zeros(digits.CLASSES),
    ]
    velocity = [np.zeros_like(p) for p in params]
    for _ in range(EPOCHS):
        w1, b1, w2, b2 = params
        h = np.maximum(x @ w1 + b1, 0.0)
        z = h @ w2 + b2
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        g = (p - onehot) / n
        gh = (g @ w2.T) * (h > 0)
        grads = [x.T @ gh + L2 * w1, gh.sum(axis=0), h.T @ g + L2 * w2, g.sum(axis=0)]
        for i, gr in enumerate(grads):
            velocity[i] = MOMENTUM * velocity[i] - LEARNING_RATE * gr
            params[i] = params[i] + velocity[i]
    return Mlp(*params)


def to_onnx(model: Mlp, meta: dict[str, str]) -> onnx.ModelProto:
    """pixels [N, 64] -> Gemm, Relu, Gemm -> Softmax = probabilities, ArgMax = label."""
    inits = [
        numpy_helper.from_array(a.astype(np.float32), name)
        for name, a in (("w1", model.w1), ("b1", model.b1), ("w2", model.w2), ("b2", model.b2))
    ]
    nodes = [
        helper.make_node("Gemm", ["pixels", "w1", "b1"], ["z1"]),
        helper.make_node("Relu", ["z1"], ["h1"]),
        helper.make_node("Gemm", ["h1", "w2", "b2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "digits_mlp",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["N", digits.PIXELS])],
        [
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10]),
            helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
        ],
        inits,
    )
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="mars-tools"
    )
    m.ir_version = 8
    for k, v in sorted(meta.items()):
        prop = m.metadata_props.add()
        prop.key, prop.value = k, v
    onnx.checker.check_model(m)
    return m


def onnx_labels(path: Path, pixels: NDArray[np.float32]) -> NDArray[np.int64]:
    """The written model's `label` output, run with ONNX Runtime on the CPU."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    label = sess.run(["label"], {"pixels": pixels})[0]
    return np.asarray(label, dtype=np.int64)


def build(out: Path) -> dict[str, Any]:
    """Train, export and score; writes the model and its card into `out`, returns the card."""
    data_bytes = digits.dataset_bytes()
    data = digits.decode(data_bytes)
    train, test = digits.split(len(data["labels"]))
    x = digits.preprocess(data["pixels"])
    model = train_mlp(x[train].astype(np.float64), data["labels"][train])
    data_sha = hashlib.sha256(data_bytes).hexdigest()
    meta = {
        "dataset": "edge_agent/data/digits/digits.csv.gz (UCI optical digits, CC BY 4.0)",
        "dataset_sha256": data_sha,
        "split_seed": str(digits.SPLIT_SEED),
        "train_fraction": str(digits.TRAIN_FRACTION),
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / MODEL_NAME
    path.write_bytes(to_onnx(model, meta).SerializeToString())
    train_acc = float(np.mean(onnx_labels(path, x[train]) == data["labels"][train]))
    scored = digits.aggregate(onnx_labels(path, x[test]), data["labels"][test])
    card: dict[str, Any] = {
        "model": MODEL_NAME,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "bytes": path.stat().st_size,
        "task": "classify 8x8 images of handwritten digits (0-9)",
        "inputs": {"pixels": "float32 [N, 64]: pixel counts 0..16 divided by 16, row-major"},
        "outputs": {
            "probabilities": "float32 [N, 10]: softmax over the digits",
            "label": "int64 [N]: the most probable digit",
        },
        "architecture": f"64 -> {HIDDEN} ReLU -> 10 softmax (Gemm, Relu, Gemm; ONNX opset 17)",
        "data": {
            "file": "edge_agent/data/digits/digits.csv.gz",
            "sha256": data_sha,
            "source": "UCI Optical Recognition of Handwritten Digits (Alpaydin & Kaynak, 1998), "
            "doi:10.24432/C50P49; provenance in edge_agent/data/digits/README.md",
            "licence": "CC BY 4.0",
        },
        "split": {
            "rule": "edge_agent.digits.split: seeded permutation, first fraction is train",
            "seed": digits.SPLIT_SEED,
            "train_fraction": digits.TRAIN_FRACTION,
            "train_images": len(train),
            "test_images": len(test),
        },
        "training": {
            "method": "full-batch gradient descent with momentum, cross-entropy + L2, float64",
            "init_seed": INIT_SEED,
            "epochs": EPOCHS,
            "learning_rate": LEARNING_RATE,
            "momentum": MOMENTUM,
            "l2": L2,
        },
        "train_accuracy": train_acc,
        "held_out": {k: scored[k] for k in ("images", "correct", "accuracy", "confusion")},
        "command": "python tools/train_digits.py",
        "built_with": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "onnx": onnx.__version__,
        },
    }
    (out / CARD_NAME).write_text(card_text(card))
    return card


def card_text(card: dict[str, Any]) -> str:
    """JSON with one line per list of numbers (the confusion matrix reads as a table)."""
    text = json.dumps(card, indent=1)
    flat = re.sub(r"\[\s+([-\d.,\s]+?)\s+\]", lambda m: "[" + " ".join(m[1].split()) + "]", text)
    return flat + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Train the digits classifier and export it to ONNX.")
    p.add_argument("--out", type=Path, default=OUT, help="directory for the model and its card")
    args = p.parse_args(argv)
    card = build(args.out)
    held = card["held_out"]
    print(f"wrote {args.out / MODEL_NAME} ({card['bytes']} bytes, sha256 {card['sha256']})")
    print(
        f"held-out accuracy {held['accuracy']:.4f} ({held['correct']} of {held['images']}), "
        f"train accuracy {card['train_accuracy']:.4f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
