"""HEFT (Topcuoglu, Hariri, Wu 2002): list scheduling by upward rank, earliest finish time.

Tasks are taken in decreasing upward rank (among those whose predecessors are placed; ties by
topological position) and each goes to the (device, slot) where it finishes first, with ties
to the lower device index, then the lower slot. With `insertion`, a task may fill an idle gap
between earlier bookings. The loop itself is the shared engine (`engine.ListScheduler`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

from orchestrator.scheduling import compiled
from orchestrator.scheduling.cost import CostModel
from orchestrator.scheduling.engine import (
    ListScheduler,
    Prepared,
)
from orchestrator.scheduling.model import Cluster, TaskGraph
from orchestrator.scheduling.plan import Placement, Plan
from orchestrator.scheduling.ranks import (
    Summary,
    priority_keys,
    summarise_compute,
    upward_rank_array,
)

__all__ = ["Ties", "heft", "heft_prepared", "tie_broken"]

#: How tasks of equal rank are ordered: by topological position (the default), the reverse
#: ("late"), or the longer mean compute first ("work"). Regular workflows (many identical
#: tasks) tie often, and which goes first changes the plan.
Ties = Literal["topo", "late", "work"]


def tie_broken(prep: Prepared, keys: list[int], ties: Ties) -> list[int]:
    """`keys` with equal ones ordered by `ties` (the ready heap orders the rest by topological
    position); keys stay small enough for the compiled loop's int64."""
    if ties == "topo":
        return keys
    n = len(keys)
    if ties == "late":
        second = [n - pos for pos in prep.topo_pos]
    else:
        wbar = summarise_compute(prep.w, "mean").tolist()
        order = sorted(range(n), key=lambda i: -wbar[i] if wbar[i] < math.inf else 0.0)
        second = [0] * n
        for r, i in enumerate(order):
            second[i] = r
    return [k * (n + 1) + s for k, s in zip(keys, second, strict=True)]


def heft_prepared(
    prep: Prepared,
    *,
    insertion: bool = True,
    rank: Summary = "mean",
    comm: float = 1.0,
    ties: Ties = "topo",
) -> Plan:
    """HEFT on an already checked request (the portfolio shares one `Prepared`).

    `rank` picks the per-task compute time the upward rank sums: the paper's mean over
    eligible devices, or the median or best (named in `Plan.algorithm` when not the mean);
    `comm` scales the transfer part of the rank (named when not 1); `ties` as `Ties` (named
    when not the default).
    """
    if rank == "mean" and comm == 1.0:
        ranks = prep.upward()
    else:
        wbar = None if rank == "mean" else summarise_compute(prep.w, rank)
        ranks = upward_rank_array(prep.graph, prep.w, prep.table, wbar, comm)
    keys = tie_broken(prep, priority_keys(ranks), ties)
    name = "heft" if insertion else "heft-noins"
    if rank != "mean":
        name += f"-rank-{rank}"
    if comm != 1.0:
        name += f"-comm{comm:g}"
    if ties != "topo":
        name += f"-ties-{ties}"
    return ListScheduler(prep, insertion).run(keys, None, name)


def heft(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    *,
    fixed: Mapping[str, Placement] | None = None,
    now: float = 0.0,
    insertion: bool = True,
) -> Plan:
    """Plan every task not in `fixed` to start no earlier than `now`; see the module doc.

    `fixed` holds finished or running tasks, kept as they are; it must be closed under
    predecessors (ValueError otherwise). Raises Unschedulable, listing every device and why,
    when some task not in `fixed` has no eligible device.
    """
    if not fixed:
        plan = compiled.heft_direct(graph, cluster, cost, now, insertion)
        if plan is not None:
            return plan
    return heft_prepared(Prepared(graph, cluster, cost, fixed, now), insertion=insertion)
