"""HEFT with a one-step lookahead (after Bittencourt, Sakellariou, Madeira 2010).

Plain HEFT puts a task where it finishes first even when that strands its children behind a
slow link. Here each task tries its few best devices by finish time and keeps the one that
minimises the latest *estimated* finish of its children, each child estimated on its best
device given the inputs already placed and this tentative placement (other unplaced inputs
and contention between children are ignored: an estimate, not a plan). Ties keep the earlier
finish, then HEFT's own choice. Costs about `width` x children vector passes per task, so the
portfolio only runs it on smaller problems.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.cost import CostModel
from orchestrator.scheduling.engine import Choice, ListScheduler, Prepared, ready_times
from orchestrator.scheduling.model import Cluster, TaskGraph
from orchestrator.scheduling.plan import Placement, Plan
from orchestrator.scheduling.ranks import priority_keys


def _tail_after(s: ListScheduler, d: int, k: int, finish: float) -> float:
    """Device d's earliest slot tail if slot k also held work until `finish`."""
    return min(
        max(tl.finishes[-1], finish) if q == k else tl.finishes[-1]
        for q, tl in enumerate(s.slots.timelines(d))
    )


def _candidates(s: ListScheduler, i: int, drt: NDArray[np.float64], width: int) -> list[Choice]:
    """HEFT's choice first, then the next best devices by append-only finish time."""
    first = s.earliest(i, drt)
    eft = s.append_finish(i, drt)
    out = [first]
    for d in np.argsort(eft, kind="stable")[:width].tolist():
        if len(out) >= width or not np.isfinite(eft[d]):
            break
        if d != first[0]:
            out.append(s.on_device(i, drt, d))
    return out


def lookahead_prepared(prep: Prepared, width: int = 3) -> Plan:
    """Lookahead HEFT on an already checked request (the portfolio shares one `Prepared`)."""
    graph, w, table = prep.graph, prep.w, prep.table
    keys = priority_keys(prep.upward())

    def rule(s: ListScheduler, i: int, drt: NDArray[np.float64]) -> Choice:
        succs = graph.succs[i]
        cands = _candidates(s, i, drt, width)
        if not succs or len(cands) == 1:
            return cands[0]
        # Each child's ready time from its other, already placed inputs.
        others = []
        for j, nbytes in succs:
            placed = tuple((p, b) for p, b in graph.preds[j] if p != i and s.where[p] >= 0)
            ready = ready_times(placed, s.finish, s.where, table, s.base, prep.now)
            others.append((j, nbytes, ready))
        best: tuple[float, float, int] | None = None
        chosen = cands[0]
        for pos, (d, k, start) in enumerate(cands):
            fin = start + float(w[i, d])
            tail = s.slots.tail.copy()
            tail[d] = _tail_after(s, d, k, fin)
            worst = fin
            for j, nbytes, ready in others:
                arrive = table.row(nbytes, d)
                arrive += fin
                np.maximum(arrive, ready, out=arrive)
                np.maximum(arrive, tail, out=arrive)
                arrive += w[j]
                worst = max(worst, float(arrive.min()))
            key = (worst, fin, pos)
            if best is None or key < best:
                best, chosen = key, (d, k, start)
        return chosen

    return ListScheduler(prep).run(keys, rule, "heft-lookahead")


def heft_lookahead(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    *,
    fixed: Mapping[str, Placement] | None = None,
    now: float = 0.0,
    width: int = 3,
) -> Plan:
    """Lookahead HEFT trying the `width` best devices per task; constraints and errors as
    `heft`."""
    if width < 1:
        raise ValueError("width must be >= 1")
    return lookahead_prepared(Prepared(graph, cluster, cost, fixed, now), width)
