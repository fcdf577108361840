"""Measure the corpus with ONNX Runtime on this host: the predictor's training data.

    python -m tools.predictor_profile --corpus out/predictor/corpus \
        --out orchestrator/predictor/data

Each device configuration is a (provider, intra-op threads) pair; on a CPU-only host the
1-thread and 2-thread CPU sessions are two configurations because they have different speeds
and scaling (the agent runs 1 thread; 2 threads stands in for a wider CPU). The device features
recorded for each configuration are what an agent on this host would advertise (the agent's own
calibration), so the model learns against the figures it will be given.

Timing: per (model, batch, configuration) 3 warm-up calls, then at least 11 timed calls (more
for fast models, ~0.2 s in total); the row keeps the median, the 10th/90th percentiles and the
median of each of two passes taken minutes apart (their gap is the measurement noise floor).
Before measuring, the profiler waits for the 1-minute load average to drop below a threshold;
the load is recorded per row and in the provenance.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.predictor.corpus import DEFAULT_DIR
from orchestrator.predictor.features import DATA_DIR, GraphFeatures
from schemas.agent import DeviceSpec

MEASUREMENTS = "measurements.csv"
PROVENANCE = "provenance.json"
GRAPH_COLS = [f.name for f in fields(GraphFeatures)]
COLUMNS = [
    "model", "family", "split", "config", "provider", "threads", "kind", "gflops", "mem_gbps",
    "call_overhead_ms", *GRAPH_COLS, "median_s", "p10_s", "p90_s", "pass_a_s", "pass_b_s",
    "foreign_cpu", "runs", "loadavg_1m",
]  # fmt: skip


def wait_for_idle(threshold: float, poll_s: float, max_wait_s: float) -> float:
    """Block until the 1-minute load average is below `threshold` (or give up); returns it."""
    deadline = time.monotonic() + max_wait_s
    load = os.getloadavg()[0]
    while load >= threshold and time.monotonic() < deadline:
        print(f"load average {load:.2f} >= {threshold}; waiting {poll_s:.0f}s", flush=True)
        time.sleep(poll_s)  # polling the OS load, not synchronising with anything we own
        load = os.getloadavg()[0]
    return load


def calibrated_cpu(threads: Sequence[int]) -> dict[int, DeviceSpec]:
    """This host's CPU as an agent would advertise it (median of 5 calibrations, shared by all
    configurations: the agent's figures do not depend on threads), once per thread count."""
    from edge_agent.calibrate import calibrate_device

    base = DeviceSpec(device_id="cpu", kind="cpu")
    runs = [calibrate_device(base) for _ in range(5)]
    figures: dict[str, Any] = {
        k: statistics.median(float(getattr(r, k)) for r in runs)
        for k in ("gflops", "mem_bandwidth_gbps", "call_overhead_ms")
    }
    return {
        t: base.model_copy(
            update={
                **figures,
                "device_id": f"cpu-t{t}",
                "labels": {"threads": str(t)},
                "calibrated": True,
            }
        )
        for t in threads
    }


def _session(path: Path, provider: str, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=[provider])


def time_calls(sess: Any, batch: int, min_runs: int = 11, budget_s: float = 0.2) -> list[float]:
    """Wall time of single `run` calls, as the agent's executor makes them."""
    inp = sess.get_inputs()[0]
    shape = [batch] + [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape[1:]]
    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    feed = {inp.name: x}
    t0 = time.perf_counter()
    for _ in range(3):
        sess.run(None, feed)
    warm = (time.perf_counter() - t0) / 3
    n = int(min(61, max(min_runs, math.ceil(budget_s / max(warm, 1e-6)))))
    out = []
    for _ in range(n):
        t = time.perf_counter()
        sess.run(None, feed)
        out.append(time.perf_counter() - t)
    return out


class Interference:
    """Share of the machine's CPU time used by *other* processes during a measurement: the
    load average cannot tell (it counts the profiler itself), /proc/stat minus our own CPU
    time can."""

    def __init__(self) -> None:
        import psutil

        self._ps = psutil
        self._me = psutil.Process()
        self._t0 = self._read()

    def _read(self) -> tuple[float, float, float]:
        st = self._ps.cpu_times()
        idle = st.idle + getattr(st, "iowait", 0.0)
        total = sum(st)
        mine = sum(self._me.cpu_times()[:2])
        return total, total - idle, mine

    def share(self) -> float:
        t1 = self._read()
        total = max(t1[0] - self._t0[0], 1e-9)
        return max(0.0, (t1[1] - self._t0[1]) - (t1[2] - self._t0[2])) / total


def measure(
    sess: Any, batches: Sequence[int], max_share: float, tries: int = 4
) -> tuple[dict[int, list[float]], float]:
    """Time every batch size; retried (up to `tries`) while other processes used more than
    `max_share` of the CPU meanwhile. Returns the timings and the share seen on the kept try."""
    best: tuple[dict[int, list[float]], float] | None = None
    for _ in range(tries):
        probe = Interference()
        res = {b: time_calls(sess, b) for b in batches}
        share = probe.share()
        if best is None or share < best[1]:
            best = (res, share)
        if share <= max_share:
            break
        time.sleep(0.5)  # back off while someone else holds the CPU
    assert best is not None
    return best


def host_facts() -> dict[str, Any]:
    import onnxruntime as ort

    from edge_agent.probe import probe_host

    h = probe_host()
    return {
        "host": socket.gethostname(),
        "cpu_model": h.cpu_model,
        "logical_cores": h.logical_cores,
        "physical_cores": h.physical_cores,
        "memory_mb": round(h.memory_mb),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
        "providers": ort.get_available_providers(),
    }


def profile(
    corpus: Path,
    out: Path,
    *,
    batches: Sequence[int] = (1, 8),
    threads: Sequence[int] = (1, 2),
    passes: int = 3,
    max_share: float = 0.1,
    idle_below: float = 0.8,
    idle_poll_s: float = 30.0,
    idle_max_s: float = 1200.0,
    limit: int | None = None,
) -> Path:
    manifest = json.loads((corpus / "manifest.json").read_text(encoding="utf-8"))[:limit]
    from edge_agent.executors import BUILTIN_MODELS
    from orchestrator.predictor.features import shipped_book

    book = shipped_book().dump()
    for name, e in book.items():  # built-in models are extra held-out models
        manifest.append({**e, "name": name, "family": "builtin", "split": "test",
                         "file": str(BUILTIN_MODELS / f"{name}.onnx")})  # fmt: skip
    load0 = wait_for_idle(idle_below, idle_poll_s, idle_max_s)
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    devices = calibrated_cpu(threads)
    times: dict[tuple[str, int, int], list[list[float]]] = {}
    loads: dict[tuple[str, int, int], float] = {}
    shares: dict[tuple[str, int, int], list[float]] = {}
    t_start = time.monotonic()
    for p in range(passes):
        for t in threads:
            for e in manifest:
                sess = _session(corpus / e["file"], "CPUExecutionProvider", t)
                res, share = measure(sess, batches, max_share)
                for b in batches:
                    times.setdefault((e["name"], t, b), []).append(res[b])
                    loads[(e["name"], t, b)] = os.getloadavg()[0]
                    shares.setdefault((e["name"], t, b), []).append(share)
            print(f"pass {p + 1}/{passes} threads={t} done "
                  f"({time.monotonic() - t_start:.0f}s)", flush=True)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    with (out / MEASUREMENTS).open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, COLUMNS)
        w.writeheader()
        for e in manifest:
            base, per = GraphFeatures(**e["base"]), GraphFeatures(**e["per_batch"])
            for t in threads:
                d = devices[t]
                for b in batches:
                    runs = times[(e["name"], t, b)]
                    allr = sorted(x for r in runs for x in r)
                    meds = [statistics.median(r) for r in runs]
                    g = base.at_batch(per, b)
                    w.writerow({
                        "model": e["name"], "family": e["family"], "split": e["split"],
                        "config": f"cpu-ort-t{t}", "provider": "CPUExecutionProvider",
                        "threads": t, "kind": "cpu", "gflops": f"{d.gflops:.4g}",
                        "mem_gbps": f"{d.mem_bandwidth_gbps:.4g}",
                        "call_overhead_ms": f"{d.call_overhead_ms:.4g}",
                        **{k: f"{v:.6g}" for k, v in g.as_dict().items()},
                        "median_s": f"{statistics.median(meds):.6g}",
                        "p10_s": f"{allr[len(allr) // 10]:.6g}",
                        "p90_s": f"{allr[(len(allr) * 9) // 10]:.6g}",
                        "pass_a_s": f"{meds[0]:.6g}",
                        "pass_b_s": f"{meds[-1]:.6g}",
                        "foreign_cpu": f"{max(shares[(e['name'], t, b)]):.3f}",
                        "runs": len(allr), "loadavg_1m": f"{loads[(e['name'], t, b)]:.2f}",
                    })  # fmt: skip
    prov = {
        **host_facts(),
        "started_utc": started,
        "finished_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - t_start, 1),
        "loadavg_1m_at_start": round(load0, 2),
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        "idle_threshold": idle_below,
        "models": len(manifest),
        "batches": list(batches),
        "passes": passes,
        "configs": {
            f"cpu-ort-t{t}": {
                "provider": "CPUExecutionProvider",
                "intra_op_threads": t,
                "gflops": devices[t].gflops,
                "mem_bandwidth_gbps": devices[t].mem_bandwidth_gbps,
                "call_overhead_ms": devices[t].call_overhead_ms,
                "calibration": "edge_agent.calibrate.calibrate_device, median of 5 (shared)",
            }
            for t in threads
        },
        "timing": "3 warm-up calls, then >= 11 timed sess.run calls (~0.2 s) per pass; "
        "median_s is the median of the per-pass medians",
        "max_foreign_cpu": max_share,
        "retry_rule": "a (model, config) block is re-measured (up to 4 tries) while other "
        "processes used more than max_foreign_cpu of the CPU; the least disturbed try is kept",
    }
    (out / PROVENANCE).write_text(json.dumps(prov, indent=1) + "\n", encoding="utf-8")
    return out / MEASUREMENTS


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Profile the ONNX corpus on this host.")
    p.add_argument("--corpus", type=Path, default=DEFAULT_DIR)
    p.add_argument("--out", type=Path, default=DATA_DIR)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--max-foreign-cpu", type=float, default=0.1)
    p.add_argument("--idle-below", type=float, default=0.8)
    p.add_argument("--idle-max-s", type=float, default=1200.0)
    p.add_argument("--limit", type=int, default=None, help="first N corpus models only")
    args = p.parse_args(argv)
    path = profile(
        args.corpus, args.out, batches=args.batches, threads=args.threads, passes=args.passes,
        max_share=args.max_foreign_cpu,
        idle_below=args.idle_below, idle_max_s=args.idle_max_s, limit=args.limit,
    )  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
