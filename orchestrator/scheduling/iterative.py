"""Iterative HEFT: re-rank with the costs the previous plan actually incurred, re-plan.

HEFT's upward rank guesses each task's compute and transfer times as means over devices.
Once a plan exists, the real ones are known: the compute time on the chosen device and the
transfer time between the two chosen devices (zero when co-located). Ranking again with those
and re-planning often shortens the critical path the mean hid; a few rounds, keeping the best,
cost a few HEFT runs. Deterministic: no randomness, fixed number of rounds.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from orchestrator.scheduling.cost import CostModel
from orchestrator.scheduling.engine import ListScheduler, Prepared
from orchestrator.scheduling.heft import heft_prepared
from orchestrator.scheduling.model import Cluster, TaskGraph
from orchestrator.scheduling.plan import Placement, Plan
from orchestrator.scheduling.ranks import priority_keys


def _realised_ranks(prep: Prepared, plan: Plan) -> list[float]:
    graph, cluster = prep.graph, prep.cluster
    where = [cluster.index[plan.placements[t].device_id] for t in graph.ids]
    dense = prep.table.dense()
    rank = [0.0] * len(graph)
    for i in reversed(graph.topo):
        di = where[i]
        best = 0.0
        for j, nbytes in graph.succs[i]:
            dj = where[j]
            if dense is not None:
                t = float(nbytes / dense[1][di, dj] + dense[0][di, dj])
            else:
                t = float(prep.table.row(nbytes, di)[dj])
            r = t + rank[j]
            if r > best:
                best = r
        rank[i] = float(prep.w[i, di]) + best
    return rank


def iterative_heft_prepared(prep: Prepared, rounds: int = 2) -> Plan:
    best = plan = heft_prepared(prep)
    for k in range(rounds):
        keys = priority_keys(np.asarray(_realised_ranks(prep, plan), dtype=np.float64))
        plan = ListScheduler(prep).run(keys, None, f"heft-iter{k + 1}")
        if plan.makespan < best.makespan:
            best = plan
    return best


def iterative_heft(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    *,
    fixed: Mapping[str, Placement] | None = None,
    now: float = 0.0,
    rounds: int = 2,
) -> Plan:
    """HEFT, then `rounds` re-rankings on realised costs; the best plan. Constraints and
    errors as `heft`."""
    return iterative_heft_prepared(Prepared(graph, cluster, cost, fixed, now), rounds)
