"""Random layered DAGs and clusters in the style of Topcuoglu, Hariri and Wu (TPDS 2002).

Why: the published HEFT/CPOP/PEFT comparisons use this generator family, so results on it are
comparable with the literature, and its knobs (size, shape, communication-to-computation
ratio, machine heterogeneity) let a benchmark sweep one factor at a time.

Shape parameter alpha: about sqrt(v)/alpha levels of about alpha*sqrt(v) tasks each
(alpha >> 1: short and wide, much parallelism; alpha << 1: long and thin). CCR: mean edge
transfer time (bytes / `bandwidth_Bps`) over mean task work. Machine heterogeneity beta:
speeds uniform in [1 - beta/2, 1 + beta/2] times the mean.
"""

from __future__ import annotations

import math

import numpy as np

from orchestrator.scheduling.model import Cluster, Device, Task, TaskGraph


def _level_widths(rng: np.random.Generator, v: int, alpha: float) -> list[int]:
    """v tasks split into ~sqrt(v)/alpha levels, each width drawn around the mean width."""
    levels = max(1, min(v, round(math.sqrt(v) / alpha)))
    share = rng.uniform(0.5, 1.5, size=levels)
    widths = np.maximum(1, np.floor(share / share.sum() * v)).astype(np.int64)
    # Hand out (or take back) the rounding remainder one task at a time, widest share first.
    order = np.argsort(-share, kind="stable")
    j = 0
    while (extra := v - int(widths.sum())) != 0:
        lvl = int(order[j % levels])
        if extra > 0:
            widths[lvl] += 1
        elif widths[lvl] > 1:
            widths[lvl] -= 1
        j += 1
    return [int(x) for x in widths]


def random_dag(
    v: int,
    *,
    ccr: float,
    alpha: float = 1.0,
    out_degree: int = 3,
    mean_work: float = 10.0,
    bandwidth_Bps: float = 1.0,
    seed: int,
) -> TaskGraph:
    """A random layered DAG of `v` tasks named `t0..t{v-1}` in level order.

    Each task of a non-final level gets 1..2*out_degree-1 children (mean `out_degree`, capped
    by what exists) drawn from later levels; a task with no parent in the level just above
    gets one from there, so the longest path crosses every level (depth = number of levels).
    Work is uniform in [0.1, 1.9] x `mean_work`. Edge bytes are drawn uniform in [0.1, 1.9] x
    their mean, then scaled so that the realised mean transfer time at `bandwidth_Bps` divided
    by the realised mean work equals `ccr`.
    """
    if v < 1:
        raise ValueError("v must be >= 1")
    if not (ccr >= 0 and alpha > 0 and out_degree >= 1 and mean_work > 0 and bandwidth_Bps > 0):
        raise ValueError("need ccr >= 0, alpha > 0, out_degree >= 1, mean_work > 0, bandwidth > 0")
    rng = np.random.default_rng(seed)
    widths = _level_widths(rng, v, alpha)
    bounds = np.cumsum([0, *widths])  # level l holds tasks bounds[l] .. bounds[l+1]-1
    work = rng.uniform(0.1, 1.9, size=v) * mean_work

    pairs: set[tuple[int, int]] = set()
    for lvl in range(len(widths) - 1):
        later = int(bounds[lvl + 1])
        for i in range(int(bounds[lvl]), later):
            k = min(v - later, int(rng.integers(1, 2 * out_degree)))
            for j in rng.choice(np.arange(later, v), size=k, replace=False).tolist():
                pairs.add((i, j))
    level = np.repeat(np.arange(len(widths)), widths).tolist()
    fed = {j for i, j in pairs if level[i] == level[j] - 1}
    for lvl in range(1, len(widths)):
        lo, hi = int(bounds[lvl - 1]), int(bounds[lvl])
        for j in range(hi, int(bounds[lvl + 1])):
            if j not in fed:
                pairs.add((int(rng.integers(lo, hi)), j))

    ordered = sorted(pairs)
    raw = rng.uniform(0.1, 1.9, size=len(ordered))
    if ordered and ccr > 0:
        target_mean_bytes = ccr * float(work.mean()) * bandwidth_Bps
        nbytes = raw * (target_mean_bytes / float(raw.mean()))
    else:
        nbytes = np.zeros(len(ordered))
    tasks = [Task(f"t{i}", work=float(work[i])) for i in range(v)]
    edges = {(f"t{i}", f"t{j}"): float(b) for (i, j), b in zip(ordered, nbytes, strict=True)}
    return TaskGraph(tasks, edges)


def random_cluster(
    n: int,
    *,
    beta: float = 0.5,
    seed: int,
    mean_speed: float = 1.0,
    slots: int = 1,
    sites: int = 1,
    tier: str = "edge",
) -> Cluster:
    """`n` CPU devices `p0..p{n-1}`, one agent each, speeds uniform in
    [1 - beta/2, 1 + beta/2] x `mean_speed`, spread round-robin over `sites` sites (one site:
    the fully connected uniform network of the Topcuoglu experiments)."""
    if n < 1 or sites < 1:
        raise ValueError("n and sites must be >= 1")
    if not 0 <= beta < 2:
        raise ValueError("beta must be in [0, 2) so that every speed is positive")
    rng = np.random.default_rng(seed)
    speeds = rng.uniform(1 - beta / 2, 1 + beta / 2, size=n) * mean_speed
    return Cluster(
        [
            Device(
                id=f"p{j}",
                agent_id=f"a{j}",
                site=f"s{j % sites}",
                tier=tier,
                slots=slots,
                speed=float(speeds[j]),
            )
            for j in range(n)
        ]
    )
