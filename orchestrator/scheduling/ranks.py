"""Task priorities for list scheduling (HEFT's upward rank, CPOP's downward rank).

rank_u(i) = mean compute time of i over its eligible devices
            + max over successors j of (mean transfer time of edge i->j + rank_u(j)).
rank_d(i) = max over predecessors p of (rank_d(p) + mean compute of p + mean transfer p->i).

The "mean compute" may be swapped for the median or the best (fastest) eligible device: on
very heterogeneous clusters the mean is dominated by slow devices no good plan uses, and a
portfolio gains by trying the other summaries too.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.constraints import eligibility_matrix
from orchestrator.scheduling.cost import CostModel, cost_arrays
from orchestrator.scheduling.model import Cluster, TaskGraph
from orchestrator.scheduling.transfer import TransferTable


def mean_compute(w: NDArray[np.float64]) -> NDArray[np.float64]:
    """Row means over finite entries (eligible devices); inf for a row with none."""
    finite = np.isfinite(w)
    if w.shape[1] and np.logical_and.reduce(finite, axis=None):
        # the usual case, in a third of the time: the same sums
        every: NDArray[np.float64] = np.add.reduce(w, axis=1) / w.shape[1]
        return every
    count = finite.sum(axis=1)
    total = np.where(finite, w, 0.0).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out: NDArray[np.float64] = np.where(count > 0, total / np.maximum(count, 1), np.inf)
    return out


Summary = Literal["mean", "median", "best", "harmonic"]


def summarise_compute(w: NDArray[np.float64], how: Summary = "mean") -> NDArray[np.float64]:
    """Per task: the mean, median or minimum compute time over its eligible devices."""
    if how == "mean":
        return mean_compute(w)
    if not w.shape[1]:
        return np.full(len(w), np.inf)
    if how == "best":
        out: NDArray[np.float64] = w.min(axis=1)
        return out
    if how == "harmonic":  # = work / mean speed on related machines
        with np.errstate(divide="ignore"):
            inv = np.where(np.isfinite(w), 1.0 / w, 0.0)
            count = np.isfinite(w).sum(axis=1)
            total = inv.sum(axis=1)
            harm: NDArray[np.float64] = np.where(
                total > 0, count / np.where(total > 0, total, 1.0), np.where(count > 0, 0.0, np.inf)
            )
        return harm
    s = np.sort(w, axis=1)  # inf (ineligible) sorts last
    count = np.isfinite(s).sum(axis=1)
    lo = np.maximum((count - 1) // 2, 0)[:, None]
    hi = np.minimum(count // 2, w.shape[1] - 1)[:, None]
    mid = (np.take_along_axis(s, lo, axis=1) + np.take_along_axis(s, hi, axis=1))[:, 0] / 2
    med: NDArray[np.float64] = np.where(count > 0, mid, np.inf)
    return med


def upward_rank_array(
    graph: TaskGraph,
    w: NDArray[np.float64],
    table: TransferTable,
    wbar_array: NDArray[np.float64] | None = None,
    comm: float = 1.0,
) -> NDArray[np.float64]:
    """Upward ranks indexed like `graph.tasks`, from a compute matrix and transfer table
    (`wbar_array` replaces the mean compute time per task when given; `comm` scales the mean
    transfer times, e.g. to discount edges a good plan keeps on one device)."""
    wbar = (mean_compute(w) if wbar_array is None else wbar_array).tolist()
    rank = [0.0] * len(graph)
    succs = graph.succs
    lat, inv = table.affine()
    for i in reversed(graph.topo):
        best = 0.0
        for j, nbytes in succs[i]:
            r = comm * (lat + nbytes * inv) + rank[j]
            if r > best:
                best = r
        rank[i] = wbar[i] + best
    return np.asarray(rank, dtype=np.float64)


def downward_rank_array(
    graph: TaskGraph,
    w: NDArray[np.float64],
    table: TransferTable,
    comm: float = 1.0,
    wbar_array: NDArray[np.float64] | None = None,
    own: bool = False,
) -> NDArray[np.float64]:
    """Downward ranks indexed like `graph.tasks` (0 for entry tasks); with `own`, each rank
    also counts the task's own compute time (a variant some CPOP implementations use).

    A task no device can run (possible only for a fixed one) counts as taking no time.
    """
    wbar_arr = mean_compute(w) if wbar_array is None else wbar_array
    wbar = np.where(np.isfinite(wbar_arr), wbar_arr, 0.0).tolist()
    rank = [0.0] * len(graph)
    preds = graph.preds
    lat, inv = table.affine()
    for i in graph.topo:
        best = 0.0
        for p, nbytes in preds[i]:
            r = rank[p] + comm * (lat + nbytes * inv) + (0.0 if own else wbar[p])
            if r > best:
                best = r
        rank[i] = best + (wbar[i] if own else 0.0)
    return np.asarray(rank, dtype=np.float64)


def upward_ranks(graph: TaskGraph, cluster: Cluster, cost: CostModel) -> dict[str, float]:
    """Upward rank of every task, by id."""
    eligible = eligibility_matrix(graph, cluster)
    w, table = cost_arrays(cost, graph.tasks, cluster, eligible)
    ranks = upward_rank_array(graph, w, table)
    return dict(zip(graph.ids, ranks.tolist(), strict=True))


def priority_keys(rank: NDArray[np.float64]) -> list[int]:
    """Sort keys for "highest rank first": ranks quantised to ~1e-9 of the largest, negated.

    Quantising makes ranks that differ only by rounding noise (80 vs 79.99999999999999) tie,
    so the stable tie-break (topological position) decides, not floating-point luck.
    Up to SMALL_KEYS ranks, Python floats do the same arithmetic faster than numpy calls
    (`round` and `np.rint` both round half to even).
    """
    if len(rank) <= SMALL_KEYS:
        return _small_keys(rank.tolist())
    return _array_keys(rank)


def _array_keys(rank: NDArray[np.float64]) -> list[int]:
    finite = rank[np.isfinite(rank)]
    scale = float(np.abs(finite).max()) if finite.size else 0.0
    quantum = scale * 2.0**-30
    if quantum == 0.0:  # no rank, or every one too close to 0 to tell apart: all tie
        return [0] * len(rank)
    clipped = np.where(np.isfinite(rank), rank, scale * 2.0)
    keys: list[int] = (-np.rint(clipped / quantum)).astype(np.int64).tolist()
    return keys


#: Up to this many tasks, `priority_keys` works on Python floats.
SMALL_KEYS = 32


def _small_keys(rank: list[float]) -> list[int]:
    scale = max((abs(r) for r in rank if math.isfinite(r)), default=0.0)
    quantum = scale * 2.0**-30
    if quantum == 0.0:
        return [0] * len(rank)
    big = scale * 2.0
    return [-round((r if math.isfinite(r) else big) / quantum) for r in rank]
