"""HEFT (Topcuoglu, Hariri, Wu 2002): list scheduling by upward rank, earliest finish time.

Tasks are taken in decreasing upward rank (among those whose predecessors are placed; ties by
topological position) and each goes to the (device, slot) where it finishes first, with ties
to the lower device index, then the lower slot. With `insertion`, a task may fill an idle gap
between earlier bookings.

Speed: the finish time on every device is computed as one numpy vector assuming the task goes
at the end of a slot; only devices that have an idle gap after the task's data-ready time and
could possibly beat that vector's minimum are searched exactly (bisect on the slot timeline).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.constraints import (
    Unschedulable,
    eligibility_matrix,
    ineligibility,
)
from orchestrator.scheduling.cost import CostModel, cost_arrays
from orchestrator.scheduling.model import Cluster, TaskGraph
from orchestrator.scheduling.plan import Placement, Plan
from orchestrator.scheduling.ranks import priority_keys, upward_rank_array
from orchestrator.scheduling.timeline import SlotTimeline
from orchestrator.scheduling.transfer import TransferTable


def check_fixed(graph: TaskGraph, cluster: Cluster, fixed: Mapping[str, Placement]) -> None:
    """Fixed placements must name known tasks/devices/slots and be closed under predecessors."""
    problems: list[str] = []
    for tid, p in fixed.items():
        if tid not in graph or p.task_id != tid:
            problems.append(f"fixed placement {tid!r} is not a task of the graph")
            continue
        if p.device_id not in cluster:
            problems.append(f"fixed {tid!r} is on unknown device {p.device_id!r}")
        elif not 0 <= p.slot < cluster.device(p.device_id).slots:
            problems.append(f"fixed {tid!r} has slot {p.slot} out of range")
        if not (math.isfinite(p.start) and math.isfinite(p.finish) and p.start <= p.finish):
            problems.append(f"fixed {tid!r} has a bad window ({p.start}, {p.finish})")
        missing = [s for s in graph.predecessors(tid) if s not in fixed]
        if missing:
            problems.append(f"fixed {tid!r} has predecessors that are not fixed: {missing}")
    if problems:
        raise ValueError("; ".join(problems))


def unschedulable_reasons(
    graph: TaskGraph, cluster: Cluster, w: NDArray[np.float64], todo: Sequence[int]
) -> dict[str, dict[str, str]]:
    """For each task in `todo` with no usable device: every device and why it was refused."""
    usable = np.isfinite(w).sum(axis=1) > 0
    reasons: dict[str, dict[str, str]] = {}
    for i in todo:
        if usable[i]:
            continue
        task = graph.tasks[i]
        per_device: dict[str, str] = {}
        for dev in cluster.devices:
            why = ineligibility(task, dev)
            per_device[dev.id] = why if why is not None else "no finite compute time"
        reasons[task.id] = per_device
    return reasons


class _Slots:
    """All slot timelines of a cluster plus per-device summaries as numpy vectors."""

    __slots__ = ("free_at", "horizon", "tail", "timelines")

    def __init__(self, cluster: Cluster, now: float, fixed: Mapping[str, Placement]) -> None:
        booked: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for p in fixed.values():
            booked.setdefault((cluster.index[p.device_id], p.slot), []).append((p.start, p.finish))
        self.timelines: list[list[SlotTimeline]] = [
            [SlotTimeline(now, [*dev.busy, *booked.get((d, k), ())]) for k in range(dev.slots)]
            for d, dev in enumerate(cluster.devices)
        ]
        m = len(cluster)
        self.tail = np.empty(m, dtype=np.float64)
        self.horizon = np.empty(m, dtype=np.float64)
        self.free_at = np.empty(m, dtype=np.float64)
        for d in range(m):
            self.refresh(d)

    def refresh(self, d: int) -> None:
        tls = self.timelines[d]
        if len(tls) == 1:
            tl = tls[0]
            self.tail[d], self.horizon[d], self.free_at[d] = tl.finishes[-1], tl.horizon, tl.head
            return
        self.tail[d] = min(tl.finishes[-1] for tl in tls)
        self.horizon[d] = max(tl.horizon for tl in tls)
        self.free_at[d] = min(tl.head for tl in tls)

    def best_slot(
        self, d: int, ready: float, duration: float, insertion: bool, limit: float = math.inf
    ) -> tuple[int, float]:
        """(slot, start) of the earliest finish on device d; ties go to the lower slot.

        With a finite `limit` the answer is exact only if its finish is <= limit.
        """
        if duration <= 0:
            return 0, ready  # occupies no time, so nothing can be in its way
        best_k, best_start = 0, math.inf
        for k, tl in enumerate(self.timelines[d]):
            if not insertion or ready >= tl.horizon:
                s = tl.finishes[-1]
                if s < ready:
                    s = ready
            else:
                s = tl.earliest_start(ready, duration, limit)
            if s < best_start:
                best_k, best_start = k, s
                if s + duration < limit:
                    limit = s + duration
        return best_k, best_start


def _ready_times(
    preds: Sequence[tuple[int, float]],
    finish: list[float],
    where: list[int],
    table: TransferTable,
    base: NDArray[np.float64],
    now: float,
) -> NDArray[np.float64]:
    """Per device: when all inputs can have arrived there (never before `now`; `base` is
    `now` on every device and is returned, not copied, for a task without inputs)."""
    if not preds:
        return base
    p, nbytes = preds[0]
    drt = table.row(nbytes, where[p])
    drt += finish[p]
    if finish[p] < now:  # only a fixed predecessor can finish before now
        np.maximum(drt, base, out=drt)
    for p, nbytes in preds[1:]:
        arrival = table.row(nbytes, where[p])
        arrival += finish[p]
        np.maximum(drt, arrival, out=drt)
    return drt


def _search_gaps(
    slots: _Slots,
    cand: NDArray[np.intp],
    lower: NDArray[np.float64],
    drt: NDArray[np.float64],
    wi: NDArray[np.float64],
    best_d: int,
    best: float,
) -> tuple[int, tuple[int, float] | None]:
    """Exact insertion search on the devices that might beat the append-only best.

    Candidates go in order of their lower bound (duration + the later of ready time and the
    device's first free instant), so the search stops as soon as no remaining one can beat or
    tie the best found; ties keep the lower index.
    """
    chosen: tuple[int, float] | None = None
    lb = lower[cand]
    order = np.argsort(lb, kind="stable")
    for c, bound in zip(cand[order].tolist(), lb[order].tolist(), strict=True):
        if bound > best:
            break
        dur = float(wi[c])
        k, s = slots.best_slot(c, float(drt[c]), dur, True, best)
        fin = s + dur
        if fin < best or (fin == best and c < best_d):
            best, best_d, chosen = fin, c, (k, s)
        elif c == best_d:
            chosen = (k, s)
    return best_d, chosen


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
    fixed = dict(fixed or {})
    check_fixed(graph, cluster, fixed)
    n = len(graph)
    fixed_idx = sorted(graph.index[t] for t in fixed)
    is_fixed = [False] * n
    for i in fixed_idx:
        is_fixed[i] = True
    todo = [i for i in range(n) if not is_fixed[i]]
    eligible = eligibility_matrix(graph.tasks, cluster)
    w, table = cost_arrays(cost, graph.tasks, cluster, eligible)
    reasons = unschedulable_reasons(graph, cluster, w, todo)
    if reasons:
        raise Unschedulable(reasons)

    rank = priority_keys(upward_rank_array(graph, w, table))
    topo_pos = [0] * n
    for pos, i in enumerate(graph.topo):
        topo_pos[i] = pos

    slots = _Slots(cluster, now, fixed)
    placements: dict[str, Placement] = {}
    finish = [0.0] * n
    where = [-1] * n
    for i in fixed_idx:
        p = fixed[graph.ids[i]]
        placements[p.task_id] = p
        finish[i] = p.finish
        where[i] = cluster.index[p.device_id]

    waiting = [0] * n
    heap: list[tuple[int, int, int]] = []
    for i in todo:
        waiting[i] = sum(1 for p, _ in graph.preds[i] if not is_fixed[p])
        if waiting[i] == 0:
            heap.append((rank[i], topo_pos[i], i))
    heapq.heapify(heap)

    base = np.full(len(cluster), now, dtype=np.float64)
    has_zero = (w == 0).any(axis=1).tolist()
    tail, horizon, free_at = slots.tail, slots.horizon, slots.free_at
    ids, devices = graph.ids, cluster.ids
    while heap:
        _, _, i = heapq.heappop(heap)
        wi = w[i]
        drt = _ready_times(graph.preds[i], finish, where, table, base, now)
        eft = np.maximum(drt, tail)
        eft += wi
        if has_zero[i]:
            np.copyto(eft, drt, where=wi == 0)
        d = int(eft.argmin())
        chosen: tuple[int, float] | None = None
        if insertion:
            lower = np.maximum(drt, free_at)
            lower += wi
            best = float(eft[d])
            cand = np.flatnonzero((drt < horizon) & (lower <= best))
            if cand.size:
                d, chosen = _search_gaps(slots, cand, lower, drt, wi, d, best)
        dur = float(wi[d])
        if chosen is None:
            chosen = slots.best_slot(d, float(drt[d]), dur, insertion)
        k, start = chosen
        end = start + dur
        slots.timelines[d][k].book(start, end)
        slots.refresh(d)
        finish[i], where[i] = end, d
        placements[ids[i]] = Placement(ids[i], devices[d], k, start, end)
        for j, _ in graph.succs[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(heap, (rank[j], topo_pos[j], j))
    return Plan(placements=placements, algorithm="heft" if insertion else "heft-noins")
