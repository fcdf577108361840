"""CPOP (Topcuoglu, Hariri, Wu 2002): keep the critical path together on one device.

Priority = upward rank + downward rank; the tasks whose priority equals the entry task's (the
critical path, CP) are the ones any schedule must run back to back, so CPOP puts all of them
on the single device that runs the whole CP fastest (no transfers between them), and every
other task where it finishes earliest (insertion, as HEFT). When no device may run every CP
task (pins, kinds, memory), the CP tasks fall back to earliest finish too.

Re-planning: the CP is found on the whole graph; its fixed tasks are already placed and only
the rest choose the CP device.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.cost import CostModel
from orchestrator.scheduling.engine import Choice, ListScheduler, Prepared
from orchestrator.scheduling.model import Cluster, TaskGraph
from orchestrator.scheduling.plan import Placement, Plan
from orchestrator.scheduling.ranks import (
    Summary,
    downward_rank_array,
    priority_keys,
    summarise_compute,
    upward_rank_array,
)


def critical_path(graph: TaskGraph, priority: NDArray[np.float64]) -> list[int]:
    """Task indices on the critical path: from the highest-priority entry task, repeatedly the
    successor whose priority equals it (within rounding; ties to the earlier successor)."""
    entries = [i for i in graph.topo if not graph.preds[i]]
    if not entries:
        return []
    values = priority.tolist()
    start = max(entries, key=lambda i: values[i])  # max() keeps the first of equals
    target = values[start]
    tol = 1e-9 * max(1.0, abs(target))
    path = [start]
    i = start
    while True:
        nxt = next((j for j, _ in graph.succs[i] if abs(values[j] - target) <= tol), None)
        if nxt is None:
            return path
        path.append(nxt)
        i = nxt


def critical_device(w: NDArray[np.float64], path: list[int]) -> int | None:
    """The device that runs every task of `path` in the least total time, if any may."""
    if not path or not w.shape[1]:
        return None
    total = w[path].sum(axis=0)
    d = int(total.argmin())
    return d if np.isfinite(total[d]) else None


def cpop_prepared(
    prep: Prepared, comm: float = 1.0, rank: Summary = "mean", own: bool = False
) -> Plan:
    """CPOP on an already checked request (the portfolio shares one `Prepared`); `comm`
    scales the transfer part of both ranks (named in `Plan.algorithm` when not 1)."""
    graph, w, table = prep.graph, prep.w, prep.table
    wbar = None if rank == "mean" else summarise_compute(w, rank)
    down_wbar = summarise_compute(w, "harmonic") if own else wbar
    priority = upward_rank_array(graph, w, table, wbar, comm) + downward_rank_array(
        graph, w, table, comm, down_wbar, own
    )
    name = "cpop" + ("" if rank == "mean" else f"-rank-{rank}")
    name += "" if comm == 1.0 else f"-comm{comm:g}"
    name += "-own" if own else ""
    keys = priority_keys(priority)
    path = [i for i in critical_path(graph, priority) if not prep.is_fixed[i]]
    cp_dev = critical_device(w, path)
    if cp_dev is None:
        return ListScheduler(prep).run(keys, None, name)
    on_path = set(path)

    def rule(s: ListScheduler, i: int, drt: NDArray[np.float64]) -> Choice:
        return s.on_device(i, drt, cp_dev) if i in on_path else s.earliest(i, drt)

    return ListScheduler(prep).run(keys, rule, name)


def cpop(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    *,
    fixed: Mapping[str, Placement] | None = None,
    now: float = 0.0,
) -> Plan:
    """Plan every task not in `fixed` from `now` by CPOP; constraints and errors as `heft`."""
    return cpop_prepared(Prepared(graph, cluster, cost, fixed, now))
