"""Running a scenario's variants and reporting them: tables on stdout, JSON and PNGs on disk.

Why one place: every scenario reports the same way (a row per policy variant, the same
columns, the same files), so scenario modules only say what to simulate.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.scheduling import Cluster, CostModel
from sim.des import SimConfig, SimResult, Simulator
from sim.des_events import Arrival, Failure, Slowdown
from sim.detection import HEARTBEAT, Detection
from sim.metrics import gantt_rows, series, summary
from sim.policies import Policy, make_policy


@dataclass(frozen=True, slots=True)
class Variant:
    """One row of a scenario: a policy and the failure-detection model it runs with."""

    label: str
    policy: str
    detection: Detection = HEARTBEAT


@dataclass(slots=True)
class Setup:
    """What to simulate: the cluster, the cost model, the workload and the incidents."""

    cluster: Cluster
    cost: CostModel
    arrivals: list[Arrival]
    failures: list[Failure] = field(default_factory=list)
    slowdowns: list[Slowdown] = field(default_factory=list)
    config: SimConfig = field(default_factory=SimConfig)
    params: dict[str, Any] = field(default_factory=dict)
    util_window: tuple[float, float] | None = None
    util_bins: int = 100


def log(msg: str) -> None:
    """Progress on stderr, so stdout stays the report."""
    print(msg, file=sys.stderr, flush=True)


def run_variants(
    setup: Setup,
    variants: Sequence[Variant],
    *,
    seed: int,
    make: Callable[[str, int], Policy] | None = None,
) -> dict[str, SimResult]:
    """Simulate each variant on the same setup (fresh policy state, same random seeds)."""
    make = make or (lambda name, s: make_policy(name, seed=s))
    out: dict[str, SimResult] = {}
    for v in variants:
        log(f"  simulating {v.label} ...")
        t0 = time.perf_counter()
        sim = Simulator(
            setup.cluster,
            setup.cost,
            make(v.policy, seed),
            setup.arrivals,
            failures=setup.failures,
            slowdowns=setup.slowdowns,
            config=replace(setup.config, detection=v.detection),
        )
        out[v.label] = sim.run()
        log(f"    done in {time.perf_counter() - t0:.1f} s real")
    return out


def fmt(x: object) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        if abs(x) >= 10:
            return f"{x:.1f}"
        return f"{x:.3f}"
    return str(x)


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    cells = [list(header)] + [[fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summaries(setup: Setup, results: Mapping[str, SimResult]) -> dict[str, dict[str, Any]]:
    lo, hi = setup.util_window if setup.util_window else (None, None)
    return {label: summary(r, setup.util_bins, lo, hi) for label, r in results.items()}


def policy_table(sums: Mapping[str, Mapping[str, Any]]) -> str:
    """The standard per-variant table."""
    rows = []
    for label, s in sums.items():
        rows.append(
            [
                label,
                f"{s['completed']}/{s['pipelines']}",
                s["planning_ms"]["p50"],
                s["planning_ms"]["p99"],
                s["response_s"]["mean"],
                s["response_s"]["p95"],
                s["makespan_s_mean"],
                100 * s["utilisation"]["mean"],
                100 * s["utilisation"]["peak"],
                s["throughput"]["tasks_per_s"],
                s["recovery_s"]["mean"],
                s["recovery_s"]["max"],
                s["sim"]["wall_s"],
            ]
        )
    return table(
        rows,
        [
            "variant",
            "done",
            "plan p50 ms",
            "plan p99 ms",
            "resp mean s",
            "resp p95 s",
            "makespan s",
            "util mean %",
            "util peak %",
            "tasks/s",
            "recov mean s",
            "recov max s",
            "sim wall s",
        ],
    )


def _clean(x: Any) -> Any:
    """NaN/inf become null so the JSON is standard."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def gantt_pipeline(result: SimResult) -> int:
    """The pipeline to draw: the completed one with the most attempts (a re-run shows),
    ties to the median response time."""
    done = [p for p in result.pipelines if p.completed is not None]
    if not done:
        return 0
    done.sort(key=lambda p: p.response)
    median = done[len(done) // 2]
    replanned = [p for p in done if p.replans]
    return (replanned[len(replanned) // 2] if replanned else median).index


def write_outputs(
    out: Path,
    scenario: str,
    setup: Setup,
    results: Mapping[str, SimResult],
    sums: Mapping[str, Mapping[str, Any]],
    extra: Mapping[str, Any] | None = None,
    plots: bool = True,
) -> list[Path]:
    """result.json plus utilisation.png, completion_cdf.png and gantt.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    runs = {label: series(r, setup.util_bins) for label, r in results.items()}
    first = next(iter(results))
    gp = gantt_pipeline(results[first])
    rows = gantt_rows(results[first], gp)
    doc = {
        "scenario": scenario,
        "params": setup.params,
        "config": {
            "noise_sigma": setup.config.noise_sigma,
            "seed": setup.config.seed,
            "replan_s": setup.config.replan_s,
        },
        "detection": {label: r.config.detection.describe() for label, r in results.items()},
        "summary": sums,
        "series": runs,
        "gantt": {"variant": first, "pipeline": gp, "attempts": rows},
        **(extra or {}),
    }
    written = [out / "result.json"]
    written[0].write_text(json.dumps(_clean(doc), indent=1))
    if plots:
        from sim import plots as p

        p.utilisation_png(out / "utilisation.png", runs, f"{scenario}: utilisation over time")
        p.cdf_png(out / "completion_cdf.png", runs, f"{scenario}: pipeline response-time CDF")
        name = results[first].pipelines[gp].name if results[first].pipelines else "-"
        p.gantt_png(out / "gantt.png", rows, f"{scenario}: {first}, pipeline {name}")
        written += [out / "utilisation.png", out / "completion_cdf.png", out / "gantt.png"]
    return written
