"""Running a scenario's variants and reporting them: tables on stdout, JSON and PNGs on disk.

Why one place: every scenario reports the same way (a row per policy variant, the same
columns, the same files), so scenario modules only say what to simulate.

Seeds: a scenario runs every variant on each of several seeds (each seed its own cluster,
workload and incidents, shared by every variant of that seed; see `sim.des` for the random
draws inside a run). A table cell is the mean over seeds and the half-width of its 95%
confidence interval (Student t, n - 1 degrees of freedom): `mean ± half`.
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


T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
"""Student t 0.975 quantiles for 1-30 degrees of freedom (more: 2.042, slightly wide)."""


@dataclass(frozen=True, slots=True)
class Interval:
    """Mean of `n` values and the half-width of its 95% confidence interval (NaN for n < 2)."""

    mean: float
    half: float
    n: int

    def cell(self) -> str:
        if self.n == 0:
            return "-"
        return f"{fmt(self.mean)} ± {fmt(self.half)}"

    def as_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "ci95_half": self.half, "n": self.n}


def ci95(values: Sequence[float]) -> Interval:
    """Mean and 95% Student t confidence half-width of `values` (NaNs left out):
    t(0.975, n - 1) x sample standard deviation / sqrt(n)."""
    vals = [float(v) for v in values if not math.isnan(v)]
    n = len(vals)
    if n == 0:
        return Interval(math.nan, math.nan, 0)
    mean = sum(vals) / n
    if n == 1:
        return Interval(mean, math.nan, 1)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    return Interval(mean, T975[min(n - 1, len(T975)) - 1] * sd / math.sqrt(n), n)


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


@dataclass(slots=True)
class SeedRun:
    """Every variant's result on one seed's setup."""

    seed: int
    setup: Setup
    results: dict[str, SimResult]
    sums: dict[str, dict[str, Any]]


def run_seeds(
    build: Callable[[int, bool], Setup],
    variants: Sequence[Variant],
    seeds: Sequence[int],
    quick: bool,
    name: str,
) -> list[SeedRun]:
    """`build(seed, quick)` for each seed, then every variant on that setup."""
    runs = []
    for seed in seeds:
        setup = build(seed, quick)
        log(f"{name}, seed {seed}: {setup.params}")
        results = run_variants(setup, variants, seed=seed)
        runs.append(SeedRun(seed, setup, results, summaries(setup, results)))
    return runs


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


def table(rows: Sequence[Sequence[object]], header: Sequence[str], left: int = 1) -> str:
    """Text columns; the first `left` ones left-aligned, the rest right-aligned."""
    cells = [list(header)] + [[fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [
        "  ".join(
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summaries(setup: Setup, results: Mapping[str, SimResult]) -> dict[str, dict[str, Any]]:
    lo, hi = setup.util_window if setup.util_window else (None, None)
    return {label: summary(r, setup.util_bins, lo, hi) for label, r in results.items()}


Metric = tuple[str, Callable[[Mapping[str, Any]], float]]

METRICS: tuple[Metric, ...] = (
    ("done %", lambda s: 100 * s["completed"] / s["pipelines"] if s["pipelines"] else math.nan),
    ("plan p50 ms", lambda s: s["planning_ms"]["p50"]),
    ("plan p99 ms", lambda s: s["planning_ms"]["p99"]),
    ("resp mean s", lambda s: s["response_s"]["mean"]),
    ("resp p95 s", lambda s: s["response_s"]["p95"]),
    ("util mean %", lambda s: 100 * s["utilisation"]["mean"]),
    ("util peak %", lambda s: 100 * s["utilisation"]["peak"]),
    ("recov mean s", lambda s: s["recovery_s"]["mean"]),
)
"""The standard table's columns: (header, value from one run's `summary`)."""


def interval(
    runs: Sequence[SeedRun], label: str, get: Callable[[Mapping[str, Any]], float]
) -> Interval:
    """One metric of one variant over the seeds."""
    return ci95([get(r.sums[label]) for r in runs])


def seeds_note(runs: Sequence[SeedRun]) -> str:
    seeds = [r.seed for r in runs]
    span = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
    return (
        f"mean ± 95% CI half-width (Student t) over {len(seeds)} seed(s) ({span}); every "
        "policy on the same draws per seed; planning: real ms per call after one untimed "
        "warm-up plan"
    )


def detection_groups(variants: Sequence[Variant]) -> list[list[Variant]]:
    """Variants grouped by detection model, the group of the first variant's model first."""
    groups: dict[Detection, list[Variant]] = {}
    for v in variants:
        groups.setdefault(v.detection, []).append(v)
    return list(groups.values())


def policy_table(
    runs: Sequence[SeedRun], variants: Sequence[Variant], *, recovery: bool = True
) -> str:
    """The standard table: a row per variant, rows of the same detection model together (the
    first variant's model first), each cell mean ± 95% CI half-width over the seeds. Without
    `recovery` (a scenario with no failures) neither recovery nor the detection model, which
    then plays no part, has a column."""
    metrics = [m for m in METRICS if recovery or m[0] != "recov mean s"]
    rows: list[list[object]] = []
    for group in detection_groups(variants):
        for v in group:
            cells = [interval(runs, v.label, get).cell() for _, get in metrics]
            rows.append([v.label, *([v.detection.label] if recovery else []), *cells])
    head = ["variant", *(["detection"] if recovery else []), *(h for h, _ in metrics)]
    return table(rows, head, left=2 if recovery else 1)


def ratio_line(
    runs: Sequence[SeedRun],
    variants: Sequence[Variant],
    ref: str,
    header: str,
    get: Callable[[Mapping[str, Any]], float],
) -> str:
    """Each variant's metric divided by `ref`'s on the same seed (paired), mean ± 95% CI."""
    cells = []
    for v in variants:
        if v.label == ref:
            continue
        ratios = [get(r.sums[v.label]) / get(r.sums[ref]) for r in runs]
        cells.append(f"{v.label} {ci95(ratios).cell()}")
    return f"{header} / {ref}'s, paired per seed: " + "; ".join(cells)


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
    runs: Sequence[SeedRun],
    variants: Sequence[Variant],
    extra: Mapping[str, Any] | None = None,
    plots: bool = True,
) -> list[Path]:
    """result.json (every seed's summaries, each metric's mean and interval, the first
    seed's series) plus utilisation.png, completion_cdf.png and gantt.png (first seed)
    under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    first_run = runs[0]
    setup, results = first_run.setup, first_run.results
    runs_series = {label: series(r, setup.util_bins) for label, r in results.items()}
    first = next(iter(results))
    gp = gantt_pipeline(results[first])
    rows = gantt_rows(results[first], gp)
    doc = {
        "scenario": scenario,
        "seeds": [r.seed for r in runs],
        "ci": "mean and 95% confidence half-width over seeds, Student t with n - 1 df",
        "params": {r.seed: r.setup.params for r in runs},
        "config": {
            "noise_sigma": setup.config.noise_sigma,
            "replan_s": setup.config.replan_s,
            "warmup": setup.config.warmup,
        },
        "variants": {
            v.label: {"policy": v.policy, "detection": v.detection.describe()} for v in variants
        },
        "summary": {
            v.label: {h: interval(runs, v.label, get).as_dict() for h, get in METRICS}
            for v in variants
        },
        "per_seed": {r.seed: r.sums for r in runs},
        "series": {"seed": first_run.seed, "runs": runs_series},
        "gantt": {"seed": first_run.seed, "variant": first, "pipeline": gp, "attempts": rows},
        **(extra or {}),
    }
    written = [out / "result.json"]
    written[0].write_text(json.dumps(_clean(doc), indent=1))
    if plots:
        from sim import plots as p

        tag = f"{scenario}, seed {first_run.seed}"
        p.utilisation_png(out / "utilisation.png", runs_series, f"{tag}: utilisation over time")
        p.cdf_png(out / "completion_cdf.png", runs_series, f"{tag}: pipeline response-time CDF")
        name = results[first].pipelines[gp].name if results[first].pipelines else "-"
        p.gantt_png(out / "gantt.png", rows, f"{tag}: {first}, pipeline {name}")
        written += [out / "utilisation.png", out / "completion_cdf.png", out / "gantt.png"]
    return written
