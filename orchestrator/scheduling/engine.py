"""The list-scheduling engine that HEFT, CPOP, PEFT and their variants share.

Every list scheduler here does the same three things: check the request (fixed placements,
eligibility) and build the cost arrays once (`prepare`); take tasks one at a time in some
priority order among those whose predecessors are placed; put each where some rule says. Only
the priority and the rule differ, so the loop lives here and the algorithms are a few lines.

Speed: the finish time on every device is computed as one numpy vector assuming the task goes
at the end of a slot; only devices that have an idle gap after the task's data-ready time and
could possibly beat that vector's minimum are searched exactly (bisect on the slot timeline).
A rule may add a per-device `bias` (PEFT's optimistic cost, a price in seconds) to the finish
time; the same pruning then works on finish + bias.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling import compiled
from orchestrator.scheduling.constraints import Unschedulable, eligibility_matrix, ineligibility
from orchestrator.scheduling.cost import CostModel, cost_arrays
from orchestrator.scheduling.model import Cluster, TaskGraph
from orchestrator.scheduling.plan import Placement, Plan
from orchestrator.scheduling.ranks import upward_rank_array
from orchestrator.scheduling.smallrun import run_small
from orchestrator.scheduling.timeline import ClusterSlots
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


#: Why a device is refused for a task it is eligible for but may not run on (a cost of inf:
#: a rejection, or a device the caller ruled out).
NO_COMPUTE_TIME = "no finite compute time"


def unschedulable_reasons(
    graph: TaskGraph, cluster: Cluster, w: NDArray[np.float64], todo: Sequence[int]
) -> dict[str, dict[str, str]]:
    """For each task in `todo` with no usable device: every device and why it was refused."""
    usable = np.isfinite(w).sum(axis=1) > 0
    if usable.all():
        return {}
    reasons: dict[str, dict[str, str]] = {}
    for i in todo:
        if usable[i]:
            continue
        task = graph.tasks[i]
        per_device: dict[str, str] = {}
        for dev in cluster.devices:
            why = ineligibility(task, dev)
            per_device[dev.id] = why if why is not None else NO_COMPUTE_TIME
        reasons[task.id] = per_device
    return reasons


class Prepared:
    """One checked request plus its cost arrays, shared by every algorithm a portfolio runs.

    `w` is tasks x devices compute time (inf where a task may not run); `cost` is kept for
    rules that price placements; `memo` caches arrays several algorithms derive (the upward
    rank, prices) so a portfolio computes each once. Nothing else in it changes after init.
    """

    __slots__ = (
        "_zero_rows",
        "cluster",
        "cost",
        "fixed",
        "fixed_idx",
        "graph",
        "is_fixed",
        "memo",
        "now",
        "table",
        "todo",
        "topo_pos",
        "w",
    )

    def __init__(
        self,
        graph: TaskGraph,
        cluster: Cluster,
        cost: CostModel,
        fixed: Mapping[str, Placement] | None,
        now: float,
    ) -> None:
        self.fixed: dict[str, Placement] = dict(fixed or {})
        check_fixed(graph, cluster, self.fixed)
        self.graph, self.cluster, self.cost, self.now = graph, cluster, cost, now
        n = len(graph)
        self.fixed_idx = sorted(graph.index[t] for t in self.fixed)
        self.is_fixed = [False] * n
        for i in self.fixed_idx:
            self.is_fixed[i] = True
        self.todo = [i for i in range(n) if not self.is_fixed[i]]
        eligible = eligibility_matrix(graph, cluster)
        self.w, self.table = cost_arrays(cost, graph.tasks, cluster, eligible)
        reasons = unschedulable_reasons(graph, cluster, self.w, self.todo)
        if reasons:
            raise Unschedulable(reasons)
        self.topo_pos = [0] * n
        for pos, i in enumerate(graph.topo):
            self.topo_pos[i] = pos
        self.memo: dict[str, NDArray[np.float64] | None] = {}
        self._zero_rows: list[bool] | None = None

    def critical_path_bound(self) -> float:
        """A finish no plan can beat: `now` plus the longest path through the graph when every
        task takes its fastest eligible time, every transfer is free and nothing queues.
        -inf with fixed placements (they may end anywhere)."""
        if self.fixed:
            return -math.inf
        fastest = self.w.min(axis=1).tolist()
        finish = [0.0] * len(fastest)
        for i in self.graph.topo:
            ready = max((finish[j] for j, _ in self.graph.preds[i]), default=0.0)
            finish[i] = ready + fastest[i]
        return self.now + max(finish, default=0.0)

    def zero_rows(self) -> list[bool]:
        """Per task: whether it takes no time on some device (computed once per request)."""
        if self._zero_rows is None:
            self._zero_rows = (self.w == 0).any(axis=1).tolist()
        return self._zero_rows

    def upward(self) -> NDArray[np.float64]:
        """HEFT's upward rank (mean compute), computed once per request."""
        rank = self.memo.get("upward")
        if rank is None:
            rank = self.memo["upward"] = upward_rank_array(self.graph, self.w, self.table)
        return rank


def ready_times(
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
    small = table.dense_lists()
    if small is not None:
        lat_l, bw_l = small
        acc: list[float] | None = None
        low = math.inf
        for p, nbytes in preds:
            s, fin = where[p], finish[p]
            low = min(low, fin)
            lr, br = lat_l[s], bw_l[s]
            row = [(nbytes / b + lt) + fin for b, lt in zip(br, lr, strict=True)]
            acc = (
                row if acc is None else [a if a >= r else r for a, r in zip(acc, row, strict=True)]
            )
        out = np.array(acc, dtype=np.float64)
        if low < now:  # only a fixed predecessor can finish before now
            np.maximum(out, base, out=out)
        return out
    dense = table.dense()
    if dense is not None:
        lat, bw = dense
        if len(preds) == 1:
            p, nbytes = preds[0]
            s, fin = where[p], finish[p]
            drt: NDArray[np.float64] = nbytes / bw[s]
            drt += lat[s]
            drt += fin
        else:
            src = [where[p] for p, _ in preds]
            fins = [finish[p] for p, _ in preds]
            m = np.array([b for _, b in preds], dtype=np.float64)[:, None] / bw[src]
            m += lat[src]
            m += np.array(fins, dtype=np.float64)[:, None]
            drt = m.max(axis=0)
            fin = min(fins)
        if fin < now:  # only a fixed predecessor can finish before now
            np.maximum(drt, base, out=drt)
        return drt
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
    slots: ClusterSlots,
    cand: NDArray[np.intp],
    lower: NDArray[np.float64],
    drt: NDArray[np.float64],
    wi: NDArray[np.float64],
    best_d: int,
    best: float,
    bias: NDArray[np.float64] | None,
) -> tuple[int, tuple[int, float] | None]:
    """Exact insertion search on the devices that might beat the append-only best score.

    Candidates go in order of their lower bound (duration + bias + the later of ready time
    and the device's first free instant), so the search stops as soon as no remaining one can
    beat or tie the best found; ties keep the lower index.
    """
    chosen: tuple[int, float] | None = None
    lb = lower[cand]
    order = np.argsort(lb, kind="stable")
    if bias is None:
        extra, slack = [0.0] * len(cand), 0.0
    else:
        extra = bias[cand][order].tolist()
        # A search answer is exact only if it finishes within its limit; rounding in
        # (best - b) + b must not make an inexact (too early) answer look like a tie.
        slack = 1e-9 * max(1.0, abs(best), max(abs(b) for b in extra))
    for c, bound, b in zip(cand[order].tolist(), lb[order].tolist(), extra, strict=True):
        if bound > best:
            break
        dur = float(wi[c])
        k, s = slots.best_slot(c, float(drt[c]), dur, True, best - b + slack)
        score = s + dur + b
        if score < best or (score == best and c < best_d):
            best, best_d, chosen = score, c, (k, s)
        elif c == best_d:
            chosen = (k, s)
    return best_d, chosen


Choice = tuple[int, int, float]  # (device, slot, start)
Rule = Callable[["ListScheduler", int, NDArray[np.float64]], Choice]


class ListScheduler:
    """Mutable state of one list-scheduling run: slot timelines, finish times, placements."""

    __slots__ = (
        "base",
        "finish",
        "has_zero",
        "insertion",
        "lists",
        "placements",
        "prep",
        "slots",
        "where",
    )

    def __init__(self, prep: Prepared, insertion: bool = True, lists: bool | str = True) -> None:
        """`lists=False` keeps the numpy loop even on small clusters, `lists="python"` the
        Python list loop even where the compiled one is available (for equivalence tests)."""
        self.prep, self.insertion, self.lists = prep, insertion, lists
        cluster, graph = prep.cluster, prep.graph
        self.slots = ClusterSlots(cluster, prep.now, prep.fixed)
        n = len(graph)
        self.placements: dict[str, Placement] = {}
        self.finish = [0.0] * n
        self.where = [-1] * n
        for i in prep.fixed_idx:
            p = prep.fixed[graph.ids[i]]
            self.placements[p.task_id] = p
            self.finish[i] = p.finish
            self.where[i] = cluster.index[p.device_id]
        self.base = np.full(len(cluster), prep.now, dtype=np.float64)
        self.has_zero = prep.zero_rows()

    def ready(self, i: int) -> NDArray[np.float64]:
        """Data-ready time of task i on every device (all its predecessors are placed)."""
        p = self.prep
        return ready_times(p.graph.preds[i], self.finish, self.where, p.table, self.base, p.now)

    def append_finish(self, i: int, drt: NDArray[np.float64]) -> NDArray[np.float64]:
        """Finish time on every device if task i went after the last booking of a slot."""
        wi = self.prep.w[i]
        eft = np.maximum(drt, self.slots.tail)
        eft += wi
        if self.has_zero[i]:
            np.copyto(eft, drt, where=wi == 0)
        return eft

    def earliest(
        self, i: int, drt: NDArray[np.float64], bias: NDArray[np.float64] | None = None
    ) -> Choice:
        """The (device, slot, start) minimising finish (+ bias); ties to the lower index."""
        wi = self.prep.w[i]
        score = self.append_finish(i, drt)
        if bias is not None:
            score += bias
        d = int(score.argmin())
        chosen: tuple[int, float] | None = None
        slots = self.slots
        if self.insertion:
            lower = np.maximum(drt, slots.free_at)
            lower += wi
            if bias is not None:
                lower += bias
            best = float(score[d])
            cand = ((drt < slots.horizon) & (lower <= best)).nonzero()[0]
            if cand.size:
                d, chosen = _search_gaps(slots, cand, lower, drt, wi, d, best, bias)
        if chosen is None:
            chosen = slots.best_slot(d, float(drt[d]), float(wi[d]), self.insertion)
        return d, chosen[0], chosen[1]

    def on_device(self, i: int, drt: NDArray[np.float64], d: int) -> Choice:
        """The earliest-finishing slot of device d for task i."""
        k, start = self.slots.best_slot(d, float(drt[d]), float(self.prep.w[i, d]), self.insertion)
        return d, k, start

    def book(self, i: int, d: int, k: int, start: float) -> None:
        end = start + float(self.prep.w[i, d])
        self.slots.book(d, k, start, end)
        self.finish[i], self.where[i] = end, d
        tid = self.prep.graph.ids[i]
        self.placements[tid] = Placement(tid, self.prep.cluster.ids[d], k, start, end)

    def run(self, keys: Sequence[int], rule: Rule | None, algorithm: str) -> Plan:
        """Place every task not fixed: smallest `keys[i]` first among ready tasks (ties by
        topological position), each where `rule` says (default: earliest finish)."""
        prep = self.prep
        if rule is None and self.lists:
            fast = compiled.runner() if self.lists is True else None
            if fast is not None:
                dense = prep.table.dense()  # up to DENSE_MAX devices
                if dense is not None and compiled.fits(len(prep.graph), prep.cluster.n_slots):
                    return fast(self, keys, algorithm, dense)
            small = prep.table.dense_lists()
            if small is not None:
                return run_small(self, keys, algorithm, small)
        graph, is_fixed, topo_pos = prep.graph, prep.is_fixed, prep.topo_pos
        waiting = [0] * len(graph)
        heap: list[tuple[int, int, int]] = []
        for i in prep.todo:
            waiting[i] = sum(1 for p, _ in graph.preds[i] if not is_fixed[p])
            if waiting[i] == 0:
                heap.append((keys[i], topo_pos[i], i))
        heapq.heapify(heap)
        succs = graph.succs
        while heap:
            _, _, i = heapq.heappop(heap)
            drt = self.ready(i)
            d, k, start = self.earliest(i, drt) if rule is None else rule(self, i, drt)
            self.book(i, d, k, start)
            for j, _ in succs[i]:
                waiting[j] -= 1
                if waiting[j] == 0:
                    heapq.heappush(heap, (keys[j], topo_pos[j], j))
        return Plan(placements=self.placements, algorithm=algorithm)
