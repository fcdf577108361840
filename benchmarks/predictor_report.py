"""Accuracy of the shipped predictor on held-out measurements (test models: never trained on),
and the cost of scoring.

    python -m benchmarks.predictor_report [--split test|val]

Per device configuration: % of predictions within ±10% of the measured median, MAPE, Spearman
rank correlation, and how often the predicted fastest configuration is the measured fastest for
each (model, batch). The same figures for the scaled roofline prior, and the measurement noise
floor (two passes of the same row, minutes apart), put the model's figures in context.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from orchestrator.placement.planning import PLAN_BUDGET_S
from orchestrator.predictor.features import DATA_DIR
from orchestrator.predictor.model import MODEL_FILE, LearnedModel, Predictor
from orchestrator.predictor.train import Dataset, load_dataset
from schemas.agent import DeviceSpec
from schemas.pipeline import TaskSpec

GOAL_WITHIN_10 = 90.0
GOAL_FASTEST = 95.0


def ranks(x: NDArray[Any]) -> NDArray[np.float64]:
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(len(x), dtype=np.float64)
    for v in np.unique(x):  # average ranks of ties
        m = x == v
        if m.sum() > 1:
            r[m] = r[m].mean()
    return r


def spearman(a: NDArray[Any], b: NDArray[Any]) -> float:
    if len(a) < 2:
        return float("nan")
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def metrics(pred: NDArray[Any], actual: NDArray[Any]) -> dict[str, float]:
    err = np.abs(pred - actual) / actual
    return {
        "n": float(len(actual)),
        "within_10": 100.0 * float(np.mean(err <= 0.10)),
        "mape": 100.0 * float(np.mean(err)),
        "spearman": spearman(pred, actual),
    }


def fastest_hits(ds: Dataset, pred: NDArray[Any]) -> tuple[int, int]:
    """(right, total) over (model, batch) groups measured on more than one configuration."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(ds.rows):
        groups.setdefault((r["model"], r["batch"]), []).append(i)
    right = total = 0
    actual = np.exp(ds.log_t)
    for idx in groups.values():
        if len(idx) < 2:
            continue
        total += 1
        right += int(idx[int(np.argmin(pred[idx]))] == idx[int(np.argmin(actual[idx]))])
    return right, total


def accuracy(ds: Dataset, model: LearnedModel) -> str:
    pred = model.run(ds.x, ds.log_roof.astype(np.float32))
    prior = np.exp(ds.log_roof + model.prior_log_scale)
    actual = np.exp(ds.log_t)
    noise = ds.extra["pass_b"]
    lines = [
        f"held-out test split: {len(set(ds.model.tolist()))} models, {len(ds.rows)} rows "
        f"(goals: >= {GOAL_WITHIN_10:.0f}% within ±10%, right-fastest >= {GOAL_FASTEST:.0f}%)",
        f"{'config':<14} {'source':<8} {'n':>4} {'±10%':>7} {'MAPE':>7} {'Spearman':>9}",
    ]
    for cfg in [*sorted(set(ds.config.tolist())), "all"]:
        m = np.ones(len(actual), bool) if cfg == "all" else ds.config == cfg
        for name, p in (("model", pred), ("prior", prior)):
            s = metrics(p[m], actual[m])
            lines.append(f"{cfg:<14} {name:<8} {s['n']:>4.0f} {s['within_10']:>6.1f}% "
                         f"{s['mape']:>6.1f}% {s['spearman']:>9.3f}")  # fmt: skip
        s = metrics(noise[m], ds.extra["pass_a"][m])
        lines.append(f"{cfg:<14} {'noise':<8} {s['n']:>4.0f} {s['within_10']:>6.1f}% "
                     f"{s['mape']:>6.1f}% {s['spearman']:>9.3f}   (pass B vs pass A)")  # fmt: skip
    for name, p in (("model", pred), ("prior", prior)):
        right, total = fastest_hits(ds, p)
        lines.append(
            f"right-fastest ({name}): {right}/{total} = {100.0 * right / max(total, 1):.1f}%"
        )
    for fam in sorted({r["family"] for r in ds.rows}):
        m = np.array([r["family"] == fam for r in ds.rows])
        s = metrics(pred[m], actual[m])
        lines.append(f"  family {fam:<12} n={s['n']:>3.0f} ±10%={s['within_10']:5.1f}% "
                     f"MAPE={s['mape']:5.1f}%")  # fmt: skip
    return "\n".join(lines)


def latency(model: LearnedModel, n_devices: int = 100, repeats: int = 200) -> str:
    """Median cost of one batched ORT call over `n_devices` rows, and of the full predictor
    path (features, call, bands) for one task on that many devices, uncached."""
    rng = np.random.default_rng(0)
    x = (model.lo + (model.hi - model.lo) * rng.random((n_devices, len(model.lo)))).astype(
        np.float32
    )
    lr = np.full(n_devices, -7.0, dtype=np.float32)
    for _ in range(10):
        model.run(x, lr)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model.run(x, lr)
        ts.append(time.perf_counter() - t0)
    devs = [
        DeviceSpec(device_id=f"d{i}", kind="cpu", gflops=float(20 + i), mem_bandwidth_gbps=12.0)
        for i in range(n_devices)
    ]
    p = Predictor(model=model)
    p.estimate([_task(0)], devs)  # the device set is known (as in a running orchestrator)
    full, cached = [], []
    for k in range(1, repeats // 4):
        task = _task(k)  # a task never scored before: features, one ORT call, bands
        t0 = time.perf_counter()
        p.estimate([task], devs)
        full.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        p.estimate([task], devs)
        cached.append(time.perf_counter() - t0)
    pipe = []
    for k in range(10):  # a 20-task pipeline never scored before, in one call
        tasks = [_task(1000 + 20 * k + j) for j in range(20)]
        t0 = time.perf_counter()
        p.estimate(tasks, devs)
        pipe.append((time.perf_counter() - t0) / 20)
    per_task = 1e6 * float(np.median(pipe))
    us = [1e6 * float(np.median(v)) for v in (ts, full, cached)]
    return (
        f"one ORT call scoring 1 task x {n_devices} devices: {us[0]:.0f} µs (median of "
        f"{repeats}; goal <= 100 µs)\n"
        f"predictor, new task on a known device set: {us[1]:.0f} µs; cached (same task): "
        f"{us[2]:.0f} µs\n"
        f"20-task pipeline x {n_devices} devices in one call: {per_task:.0f} µs per planned task "
        f"(planning budget {1e3 * PLAN_BUDGET_S:.0f} ms per request)"
    )


def _task(k: int) -> TaskSpec:
    return TaskSpec.model_validate(
        {
            "id": "t",
            "run": {
                "kind": "onnx",
                "model": "tiny_cnn",
                "batch": 1 + k % 64,
                "seed": k,
                "random_inputs": True,
            },
        }
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Accuracy of the predictor on held-out models.")
    p.add_argument("--data", type=Path, default=DATA_DIR)
    p.add_argument("--model", type=Path, default=MODEL_FILE)
    p.add_argument("--split", default="test", help="test (default) or val")
    args = p.parse_args(argv)
    ds = load_dataset(args.data / "measurements.csv")
    ds = ds.where(ds.split == args.split)
    model = LearnedModel(args.model)
    print(accuracy(ds, model))
    print(latency(model))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
