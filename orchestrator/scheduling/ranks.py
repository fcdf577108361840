"""Task priorities for list scheduling (HEFT's upward rank).

rank_u(i) = mean compute time of i over its eligible devices
            + max over successors j of (mean transfer time of edge i->j + rank_u(j)).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.constraints import eligibility_matrix
from orchestrator.scheduling.cost import CostModel, cost_arrays
from orchestrator.scheduling.model import Cluster, TaskGraph
from orchestrator.scheduling.transfer import TransferTable


def mean_compute(w: NDArray[np.float64]) -> NDArray[np.float64]:
    """Row means over finite entries (eligible devices); inf for a row with none."""
    finite = np.isfinite(w)
    count = finite.sum(axis=1)
    total = np.where(finite, w, 0.0).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out: NDArray[np.float64] = np.where(count > 0, total / np.maximum(count, 1), np.inf)
    return out


def upward_rank_array(
    graph: TaskGraph, w: NDArray[np.float64], table: TransferTable
) -> NDArray[np.float64]:
    """Upward ranks indexed like `graph.tasks`, from a compute matrix and transfer table."""
    wbar = mean_compute(w).tolist()
    rank = [0.0] * len(graph)
    succs = graph.succs
    mean = table.mean
    for i in reversed(graph.topo):
        best = 0.0
        for j, nbytes in succs[i]:
            r = mean(nbytes) + rank[j]
            if r > best:
                best = r
        rank[i] = wbar[i] + best
    return np.asarray(rank, dtype=np.float64)


def upward_ranks(graph: TaskGraph, cluster: Cluster, cost: CostModel) -> dict[str, float]:
    """Upward rank of every task, by id."""
    eligible = eligibility_matrix(graph.tasks, cluster)
    w, table = cost_arrays(cost, graph.tasks, cluster, eligible)
    ranks = upward_rank_array(graph, w, table)
    return dict(zip(graph.ids, ranks.tolist(), strict=True))


def priority_keys(rank: NDArray[np.float64]) -> list[int]:
    """Sort keys for "highest rank first": ranks quantised to ~1e-9 of the largest, negated.

    Quantising makes ranks that differ only by rounding noise (80 vs 79.99999999999999) tie,
    so the stable tie-break (topological position) decides, not floating-point luck.
    """
    finite = rank[np.isfinite(rank)]
    scale = float(np.abs(finite).max()) if finite.size else 0.0
    if scale == 0.0:
        return [0] * len(rank)
    quantum = scale * 2.0**-30
    clipped = np.where(np.isfinite(rank), rank, scale * 2.0)
    keys: list[int] = (-np.rint(clipped / quantum)).astype(np.int64).tolist()
    return keys
