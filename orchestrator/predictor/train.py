"""Train the execution-time regressor on the measured dataset and export it to ONNX.

    python -m orchestrator.predictor.train        # writes orchestrator/predictor/predictor.onnx

The model is a small MLP (F -> 32 -> 32 -> 1, ReLU) on the *log ratio* of measured time to the
roofline estimate: the roofline carries the device's speed and the task's size (so predictions
scale sensibly to devices the data has not seen), the MLP learns how far from the roofline each
kind of graph lands on each configuration. Training is full-batch Adam in float64 numpy with a
fixed seed, early-stopped on the validation models; the test models are never looked at here.
Export builds Sub/Mul (standardise) -> MatMul/Add/Relu x2 -> MatMul/Add -> Add(log roofline)
-> Exp with the onnx helper API (needs the `dev` extra).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from orchestrator.predictor.features import (
    DATA_DIR,
    FEATURE_NAMES,
    DeviceFacts,
    GraphFeatures,
    matrix,
    roofline_seconds,
)

MODEL_FILE = Path(__file__).resolve().parent / "predictor.onnx"
HIDDEN = 32
SEED = 20240611
F32 = NDArray[np.float32]
F64 = NDArray[np.float64]


# -- dataset --------------------------------------------------------------------------------------
@dataclass
class Dataset:
    rows: list[dict[str, str]]
    x: F32
    log_roof: F64
    log_t: F64
    split: NDArray[np.str_]
    config: NDArray[np.str_]
    model: NDArray[np.str_]
    extra: dict[str, F64] = field(default_factory=dict)

    def where(self, mask: NDArray[np.bool_]) -> Dataset:
        return Dataset(
            [r for r, m in zip(self.rows, mask, strict=True) if m],
            self.x[mask], self.log_roof[mask], self.log_t[mask], self.split[mask],
            self.config[mask], self.model[mask], {k: v[mask] for k, v in self.extra.items()},
        )  # fmt: skip


def row_facts(r: dict[str, str]) -> tuple[GraphFeatures, DeviceFacts]:
    g = GraphFeatures(**{f.name: float(r[f.name]) for f in fields(GraphFeatures)})
    d = DeviceFacts(
        kind=r["kind"],
        provider=r["provider"],
        gflops=float(r["gflops"]),
        mem_gbps=float(r["mem_gbps"]),
        call_overhead_s=float(r["call_overhead_ms"]) / 1e3,
        threads=int(r["threads"]),
        load=0.0,  # measured on an idle host (load average in the provenance)
        emulated=False,
    )
    return g, d


def load_dataset(path: Path = DATA_DIR / "measurements.csv") -> Dataset:
    """The measured rows; the target is `label_s` (the profiler's minimum over interleaved
    rounds), or `median_s` in data written before it existed."""
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    pairs = [row_facts(r) for r in rows]
    return Dataset(
        rows,
        matrix(pairs),
        np.log([roofline_seconds(g, d) for g, d in pairs]),
        np.log([float(r.get("label_s") or r["median_s"]) for r in rows]),
        np.array([r["split"] for r in rows]),
        np.array([r["config"] for r in rows]),
        np.array([r["model"] for r in rows]),
        {
            k: np.array(
                [float(r.get(f"{k}_s") or r[f"{k.removeprefix('first_')}_s"]) for r in rows]
            )
            for k in ("pass_a", "pass_b", "first_pass_a", "first_pass_b")
        },
    )


# -- the MLP --------------------------------------------------------------------------------------
@dataclass
class Mlp:
    mean: F64
    inv_std: F64
    w: list[F64]
    b: list[F64]

    def forward(self, x: NDArray[Any], log_roof: NDArray[Any]) -> NDArray[Any]:
        """Predicted log seconds (float64 here; `forward32` mirrors the exported graph)."""
        h = (x - self.mean) * self.inv_std
        for i, (w, b) in enumerate(zip(self.w, self.b, strict=True)):
            h = h @ w + b
            if i < len(self.w) - 1:
                h = np.maximum(h, 0.0)
        out: NDArray[Any] = h[:, 0] + log_roof
        return out

    def forward32(self, x: F32, log_roof: F32) -> F32:
        """The exported graph's arithmetic in float32: seconds, shape (N, 1)."""
        c = self.as_f32()
        h = (x - c.mean) * c.inv_std
        for i, (w, b) in enumerate(zip(c.w, c.b, strict=True)):
            h = h @ w + b
            if i < len(c.w) - 1:
                h = np.maximum(h, np.float32(0.0))
        out: F32 = np.exp(h + log_roof.reshape(-1, 1)).astype(np.float32)
        return out

    def as_f32(self) -> Mlp:
        return Mlp(
            self.mean.astype(np.float32),
            self.inv_std.astype(np.float32),
            [w.astype(np.float32) for w in self.w],
            [b.astype(np.float32) for b in self.b],
        )


def standardiser(x: NDArray[Any]) -> tuple[F64, F64]:
    """Constant columns get scale 0: a feature the data never varied cannot steer the model."""
    mean = x.mean(axis=0).astype(np.float64)
    std = x.std(axis=0).astype(np.float64)
    inv = np.where(std > 1e-9, 1.0 / np.maximum(std, 1e-9), 0.0)
    return mean, inv


def train_mlp(
    train: Dataset,
    val: Dataset,
    *,
    seed: int = SEED,
    hidden: int = HIDDEN,
    epochs: int = 6000,
    lr: float = 3e-3,
    l2: float = 1e-3,
) -> tuple[Mlp, dict[str, float]]:
    """Full-batch Adam on mean squared log error; keeps the weights best on `val`."""
    rng = np.random.default_rng(seed)
    x = train.x.astype(np.float64)
    mean, inv = standardiser(x)
    xs = (x - mean) * inv
    y = train.log_t - train.log_roof
    xv = (val.x.astype(np.float64) - mean) * inv
    yv = val.log_t - val.log_roof
    sizes = [x.shape[1], hidden, hidden, 1]
    ws = [rng.normal(0, math.sqrt(2.0 / a), (a, b)) for a, b in itertools.pairwise(sizes)]
    bs = [np.zeros(b) for b in sizes[1:]]
    bs[-1][:] = y.mean()
    params = [*ws, *bs]
    m1 = [np.zeros_like(p) for p in params]
    m2 = [np.zeros_like(p) for p in params]
    best = (math.inf, [p.copy() for p in params], 0)

    def fwd(xx: F64) -> tuple[F64, list[F64]]:
        acts = [xx]
        h = xx
        for i in range(3):
            h = h @ ws[i] + bs[i]
            if i < 2:
                h = np.maximum(h, 0.0)
            acts.append(h)
        return h[:, 0], acts

    n = len(y)
    for ep in range(epochs):
        pred, acts = fwd(xs)
        g = (2.0 / n) * (pred - y)[:, None]
        gw: list[F64] = [np.empty(0)] * 3
        gb: list[F64] = [np.empty(0)] * 3
        for i in (2, 1, 0):
            gw[i] = acts[i].T @ g + l2 * ws[i]
            gb[i] = g.sum(axis=0)
            if i > 0:
                g = (g @ ws[i].T) * (acts[i] > 0)
        grads = [*gw, *gb]
        for j, (p, gr) in enumerate(zip(params, grads, strict=True)):
            m1[j] = 0.9 * m1[j] + 0.1 * gr
            m2[j] = 0.999 * m2[j] + 0.001 * gr * gr
            mh = m1[j] / (1 - 0.9 ** (ep + 1))
            vh = m2[j] / (1 - 0.999 ** (ep + 1))
            p -= lr * mh / (np.sqrt(vh) + 1e-8)
        if ep % 20 == 0:
            vl = float(np.mean((fwd(xv)[0] - yv) ** 2))
            if vl < best[0]:
                best = (vl, [p.copy() for p in params], ep)
    params = best[1]
    model = Mlp(mean, inv, params[:3], params[3:])
    return model, {"val_mse_log": best[0], "best_epoch": float(best[2])}


# -- ONNX export ----------------------------------------------------------------------------------
def to_onnx(model: Mlp, meta: dict[str, str]) -> Any:
    """The MLP as an ONNX graph: x [N, F], log_roofline [N, 1] -> seconds [N, 1]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    c = model.as_f32()
    inits = [numpy_helper.from_array(c.mean.reshape(1, -1), "mean"),
             numpy_helper.from_array(c.inv_std.reshape(1, -1), "inv_std")]  # fmt: skip
    nodes = [helper.make_node("Sub", ["x", "mean"], ["xc"]),
             helper.make_node("Mul", ["xc", "inv_std"], ["h0"])]  # fmt: skip
    h = "h0"
    for i, (w, b) in enumerate(zip(c.w, c.b, strict=True)):
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("MatMul", [h, f"w{i}"], [f"mm{i}"]),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"a{i}"])]  # fmt: skip
        h = f"a{i}"
        if i < len(c.w) - 1:
            nodes.append(helper.make_node("Relu", [h], [f"r{i}"]))
            h = f"r{i}"
    nodes += [helper.make_node("Add", [h, "log_roofline"], ["log_seconds"]),
              helper.make_node("Exp", ["log_seconds"], ["seconds"])]  # fmt: skip
    f = len(FEATURE_NAMES)
    graph = helper.make_graph(
        nodes,
        "mars_time_predictor",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", f]),
         helper.make_tensor_value_info("log_roofline", TensorProto.FLOAT, ["N", 1])],
        [helper.make_tensor_value_info("seconds", TensorProto.FLOAT, ["N", 1])],
        inits,
    )  # fmt: skip
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="mars-predictor"
    )
    m.ir_version = 8
    for k, v in sorted(meta.items()):
        p = m.metadata_props.add()
        p.key, p.value = k, v
    onnx.checker.check_model(m)
    return m


def quantiles(r: F64) -> dict[str, float]:
    """Band of log(actual / predicted): 5th and 95th percentiles."""
    return {"q05": float(np.quantile(r, 0.05)), "q95": float(np.quantile(r, 0.95))}


def train(data: Path, out: Path, seed: int = SEED) -> dict[str, Any]:
    ds = load_dataset(data / "measurements.csv")
    tr, va = ds.where(ds.split == "train"), ds.where(ds.split == "val")
    model, info = train_mlp(tr, va, seed=seed)
    rv = va.log_t - model.forward(va.x.astype(np.float64), va.log_roof)
    prior_r = np.concatenate([tr.log_t - tr.log_roof, va.log_t - va.log_roof])
    configs = sorted({(r["kind"], r["provider"]) for r in tr.rows})
    lo = tr.x.min(axis=0).astype(float).tolist()
    hi = tr.x.max(axis=0).astype(float).tolist()
    meta = {
        "features": json.dumps(list(FEATURE_NAMES)),
        "band_model": json.dumps(quantiles(rv)),
        "band_prior": json.dumps(quantiles(prior_r)),
        "prior_log_scale": repr(float(np.median(prior_r))),
        "seen": json.dumps([list(c) for c in configs]),
        "feature_min": json.dumps(lo),
        "feature_max": json.dumps(hi),
        "train_rows": str(len(tr.rows)),
        "train_models": str(len(set(tr.model.tolist()))),
        "seed": str(seed),
        "dataset": "orchestrator/predictor/data/measurements.csv",
    }
    m = to_onnx(model, meta)
    out.write_bytes(m.SerializeToString())
    return {**info, **{k: v for k, v in meta.items() if k.startswith(("band", "train"))}}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Train the predictor and export it to ONNX.")
    p.add_argument("--data", type=Path, default=DATA_DIR)
    p.add_argument("--out", type=Path, default=MODEL_FILE)
    p.add_argument("--seed", type=int, default=SEED)
    args = p.parse_args(argv)
    info = train(args.data, args.out, args.seed)
    print(json.dumps(info, indent=1))
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
