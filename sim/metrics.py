"""Numbers from a simulation run: utilisation over time, latency and completion statistics.

Utilisation is busy slot-seconds over live slot-seconds (a dead device stops counting from
its crash), in equal time bins; "peak" is the busiest bin, so it depends on the bin width,
which the summary states. Percentiles are linear-interpolated (numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sim.des import SimResult


def _cum_busy(
    starts: NDArray[np.float64],
    ends: NDArray[np.float64],
    weights: NDArray[np.float64],
    edges: NDArray[np.float64],
) -> NDArray[np.float64]:
    """Weighted time covered by [start, end) intervals up to each edge."""
    out = np.zeros(len(edges), dtype=np.float64)
    chunk = max(1, 2_000_000 // max(1, len(edges)))
    for lo in range(0, len(starts), chunk):
        s, e, w = starts[lo : lo + chunk], ends[lo : lo + chunk], weights[lo : lo + chunk]
        covered = np.clip(edges[None, :] - s[:, None], 0.0, (e - s)[:, None])
        out += (covered * w[:, None]).sum(axis=0)
    return out


def utilisation(
    result: SimResult, bins: int = 100, t0: float | None = None, t1: float | None = None
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(bin edges, utilisation per bin in [0, 1]) from `t0` (first arrival) to `t1` (last
    finish)."""
    arrivals = [p.arrival for p in result.pipelines]
    ends = [e.finish for e in result.executions]
    lo = t0 if t0 is not None else (min(arrivals) if arrivals else 0.0)
    hi = t1 if t1 is not None else (max(ends) if ends else lo)
    if hi <= lo:
        hi = lo + 1.0
    edges = np.linspace(lo, hi, bins + 1)
    ex = result.executions
    busy = _cum_busy(
        np.fromiter((e.start for e in ex), np.float64, len(ex)),
        np.fromiter((e.finish for e in ex), np.float64, len(ex)),
        np.ones(len(ex), dtype=np.float64),
        edges,
    )
    cap = result.capacity
    live = _cum_busy(
        np.zeros(len(cap), dtype=np.float64),
        np.fromiter((min(u, 1e300) for _, _, u in cap), np.float64, len(cap)),
        np.fromiter((s for s, _, _ in cap), np.float64, len(cap)),
        edges,
    )
    dbusy, dlive = np.diff(busy), np.diff(live)
    util = np.divide(dbusy, dlive, out=np.zeros_like(dbusy), where=dlive > 0)
    return edges, util


def pct(values: Sequence[float], q: float) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return float(np.percentile(vals, q)) if vals else math.nan


def _mean(values: Sequence[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return float(np.mean(vals)) if vals else math.nan


def summary(
    result: SimResult, bins: int = 100, t0: float | None = None, t1: float | None = None
) -> dict[str, Any]:
    """The headline numbers of one run, JSON-ready (times in seconds unless named _ms);
    utilisation over [t0, t1] (default: first arrival to last finish)."""
    pipes = result.pipelines
    done = [p for p in pipes if p.completed is not None]
    resp = [p.response for p in done]
    plan_ms = [1e3 * w for w in result.plan_wall_s]
    replan_ms = [1e3 * w for w in result.replan_wall_s]
    edges, util = utilisation(result, bins, t0, t1)
    first = min((p.arrival for p in pipes), default=0.0)
    last = max((p.completed for p in done if p.completed is not None), default=first)
    span = last - first
    n_tasks = sum(p.tasks for p in done)
    rec = [f.recovery_s for f in result.failures if not math.isnan(f.recovered)]
    killed = sum(1 for e in result.executions if e.killed)
    return {
        "policy": result.policy,
        "pipelines": len(pipes),
        "completed": len(done),
        "rejected": sum(1 for p in pipes if p.rejected),
        "tasks_completed": n_tasks,
        "planning_ms": {
            "what": "real wall time of the policy's planning call per arriving pipeline",
            "p50": pct(plan_ms, 50),
            "p99": pct(plan_ms, 99),
            "max": max(plan_ms, default=math.nan),
            "mean": _mean(plan_ms),
        },
        "replanning_ms": {"p50": pct(replan_ms, 50), "max": max(replan_ms, default=math.nan)},
        "response_s": {
            "mean": _mean(resp),
            "p50": pct(resp, 50),
            "p95": pct(resp, 95),
            "p99": pct(resp, 99),
            "max": max(resp, default=math.nan),
        },
        "makespan_s_mean": _mean([p.makespan for p in done]),
        "planned_makespan_s_mean": _mean([p.planned_finish - p.arrival for p in done]),
        "utilisation": {
            "mean": float(util.mean()) if len(util) else math.nan,
            "peak": float(util.max()) if len(util) else math.nan,
            "bin_s": float(edges[1] - edges[0]) if len(edges) > 1 else math.nan,
            "window_s": [float(edges[0]), float(edges[-1])],
        },
        "throughput": {
            "pipelines_per_s": len(done) / span if span > 0 else math.nan,
            "tasks_per_s": n_tasks / span if span > 0 else math.nan,
            "window_s": span,
        },
        "recovery_s": {
            "count": len(rec),
            "mean": _mean(rec),
            "p50": pct(rec, 50),
            "max": max(rec, default=math.nan),
            "detection_mean": _mean([f.detection_s for f in result.failures]),
            "replaced_mean": _mean([f.replaced - f.at for f in result.failures]),
            "interrupted_tasks": sum(f.interrupted for f in result.failures),
            "killed_attempts": killed,
        },
        "slowdowns": len(result.slowdowns),
        "sim": {"wall_s": result.wall_s, "events": result.events, "end_s": result.end},
    }


def series(result: SimResult, bins: int = 100) -> dict[str, Any]:
    """Per-run series for JSON and plots: utilisation bins, sorted response times."""
    edges, util = utilisation(result, bins)
    resp = sorted(p.response for p in result.pipelines if p.completed is not None)
    return {
        "utilisation": {"edges": edges.tolist(), "values": util.tolist()},
        "response_s_sorted": resp,
        "planning_ms": [1e3 * w for w in result.plan_wall_s],
        "pipelines": [
            {
                "name": p.name,
                "tasks": p.tasks,
                "arrival": p.arrival,
                "first_start": p.first_start,
                "completed": p.completed,
                "planned_finish": p.planned_finish,
                "replans": p.replans,
                "rejected": p.rejected,
            }
            for p in result.pipelines
        ],
        "failures": [
            {
                "at": f.at,
                "devices": list(f.devices),
                "detection_s": f.detection_s,
                "replaced_s": f.replaced - f.at,
                "recovery_s": f.recovery_s,
                "interrupted": f.interrupted,
                "requeued": f.requeued,
                "pipelines": f.pipelines,
                "replan_ms": [1e3 * w for w in f.wall_replan_s],
            }
            for f in result.failures
        ],
        "slowdowns": [
            {"at": s.at, "device": s.device, "factor": s.factor, "running": s.running}
            for s in result.slowdowns
        ],
    }


def gantt_rows(result: SimResult, pipeline: int) -> list[dict[str, Any]]:
    """One pipeline's executed attempts, for the Gantt chart and the JSON."""
    return [
        {
            "task": e.task_id,
            "device": e.device_id,
            "slot": e.slot,
            "start": e.start,
            "finish": e.finish,
            "killed": e.killed,
        }
        for e in result.executions
        if e.pipeline == pipeline
    ]
