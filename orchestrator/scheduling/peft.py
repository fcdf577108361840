"""PEFT (Arabnejad, Barbosa 2014): earliest finish plus an optimistic look at what follows.

The optimistic cost table OCT[i, p] is the length of the longest path from task i's successors
to an exit when i runs on p and every later task gets its best device, ignoring contention:

    OCT[i, p] = max over successors j of
                min over devices q of (OCT[j, q] + w[j, q] + (mean transfer i->j if q != p))

(0 for exit tasks). Tasks go in decreasing mean OCT row (over their eligible devices) and
each to the device minimising EFT + OCT[i, device], so a task is not put where it finishes
early but strands its successors.

Speed: the inner min splits into "stay" (q = p, no transfer) and "move" (the best q plus the
transfer), `min(A[j, p], min(A[j]) + c)` with A = OCT + w, which is O(devices) per edge instead
of O(devices^2). Tasks at the same height (longest hop count to an exit) depend only on lower
ones, so each height is one batch of numpy operations over all its edges.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.cost import CostModel
from orchestrator.scheduling.engine import Choice, ListScheduler, Prepared
from orchestrator.scheduling.model import Cluster, TaskGraph
from orchestrator.scheduling.plan import Placement, Plan
from orchestrator.scheduling.ranks import priority_keys
from orchestrator.scheduling.transfer import TransferTable

#: Most edge x device elements materialised at once (32 MiB of float64).
CHUNK = 1 << 22


def _heights(graph: TaskGraph) -> list[list[int]]:
    """Tasks grouped by height (0 = exit tasks), each group in index order."""
    height = [0] * len(graph)
    for i in reversed(graph.topo):
        succs = graph.succs[i]
        if succs:
            height[i] = 1 + max(height[j] for j, _ in succs)
    levels: list[list[int]] = [[] for _ in range(max(height, default=-1) + 1)]
    for i, h in enumerate(height):
        levels[h].append(i)
    return levels


def oct_array(
    graph: TaskGraph, w: NDArray[np.float64], table: TransferTable
) -> NDArray[np.float64]:
    """OCT as a tasks x devices array (see the module doc); `w` is inf where not eligible."""
    n, m = w.shape
    oct_ = np.zeros((n, m), dtype=np.float64)
    if n == 0 or m == 0:
        return oct_
    a = w.copy()  # OCT + w, final for every level processed so far (exits: OCT = 0)
    a_min = a.min(axis=1)
    per_chunk = max(1, CHUNK // m)
    for level in _heights(graph)[1:]:
        # Most successors first, so the tasks with a p-th successor are a prefix.
        level = sorted(level, key=lambda i: -len(graph.succs[i]))
        for lo in range(0, len(level), per_chunk):
            chunk = level[lo : lo + per_chunk]
            oct_[chunk] = _level_rows(graph, chunk, a, a_min, table.mean)
        a[level] = oct_[level] + w[level]
        a_min[level] = a[level].min(axis=1)
    return oct_


def _level_rows(
    graph: TaskGraph,
    tasks: list[int],
    a: NDArray[np.float64],
    a_min: NDArray[np.float64],
    mean: Callable[[float], float],
) -> NDArray[np.float64]:
    """OCT rows of `tasks` (ordered by decreasing successor count, each with at least one)
    from their successors' final rows of A = OCT + w: one gather per successor position."""
    succs = [graph.succs[i] for i in tasks]
    acc = np.empty((len(tasks), a.shape[1]), dtype=np.float64)
    for pos in range(len(succs[0])):
        count = sum(1 for s in succs if len(s) > pos)
        dst = np.fromiter((s[pos][0] for s in succs[:count]), np.intp, count)
        move = a_min[dst]
        move += np.fromiter((mean(s[pos][1]) for s in succs[:count]), np.float64, count)
        vals = a[dst]
        np.minimum(vals, move[:, None], out=vals)
        if pos == 0:
            acc[:] = vals
        else:
            np.maximum(acc[:count], vals, out=acc[:count])
    return acc


def oct_ranks(oct_: NDArray[np.float64], w: NDArray[np.float64]) -> NDArray[np.float64]:
    """PEFT's rank: the mean OCT row over the devices the task may run on (0 if none)."""
    ok = np.isfinite(w)
    count = ok.sum(axis=1)
    total = np.where(ok, oct_, 0.0).sum(axis=1)
    out: NDArray[np.float64] = total / np.maximum(count, 1)
    return out


def optimistic_cost_table(
    graph: TaskGraph, cluster: Cluster, cost: CostModel
) -> dict[str, list[float]]:
    """OCT by task id, one value per device in cluster order (as the paper tabulates it)."""
    prep = Prepared(graph, cluster, cost, None, 0.0)
    table_ = oct_array(graph, prep.w, prep.table)
    return {tid: table_[i].tolist() for i, tid in enumerate(graph.ids)}


def peft_prepared(prep: Prepared) -> Plan:
    """PEFT on an already checked request (the portfolio shares one `Prepared`)."""
    table_ = oct_array(prep.graph, prep.w, prep.table)
    keys = priority_keys(oct_ranks(table_, prep.w))

    def rule(s: ListScheduler, i: int, drt: NDArray[np.float64]) -> Choice:
        return s.earliest(i, drt, table_[i])

    return ListScheduler(prep).run(keys, rule, "peft")


def peft(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    *,
    fixed: Mapping[str, Placement] | None = None,
    now: float = 0.0,
) -> Plan:
    """Plan every task not in `fixed` from `now` by PEFT; constraints and errors as `heft`."""
    return peft_prepared(Prepared(graph, cluster, cost, fixed, now))
