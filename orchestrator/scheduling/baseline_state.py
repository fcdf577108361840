"""Bookkeeping shared by the baseline schedulers: who is placed where, and when a slot is free.

The baselines differ only in how they pick a device; everything else (checking `fixed`,
refusing unschedulable tasks with reasons, data-ready times, slot timelines, building the
Plan) is the same and lives here so each baseline stays a few lines of policy.

"No insertion" here means what a default cluster scheduler's per-node queue does: the tasks a
baseline places on one slot run in the order they were placed (each starts no earlier than the
previous one on that slot finished). Reservations that are not the baseline's own decisions --
busy windows and fixed placements -- are obstacles the task goes around (first fit after the
queue's tail), because a real node queue cannot start work inside a maintenance window either.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.cost import CostModel
from orchestrator.scheduling.engine import Prepared
from orchestrator.scheduling.model import Cluster, TaskGraph
from orchestrator.scheduling.plan import Placement, Plan
from orchestrator.scheduling.timeline import SlotTimeline


class ListState:
    """One list-scheduling run: tasks in topological order, placed one at a time.

    `w[i, d]` is task i's compute time on device d (inf where it may not run); `order` holds
    the tasks still to place, in topological order (ties by topological index).
    """

    __slots__ = (
        "cluster",
        "finish",
        "graph",
        "now",
        "order",
        "placements",
        "queue_tail",
        "table",
        "timelines",
        "w",
        "where",
    )

    def __init__(
        self,
        graph: TaskGraph,
        cluster: Cluster,
        cost: CostModel,
        fixed: Mapping[str, Placement] | None,
        now: float,
    ) -> None:
        prep = Prepared(graph, cluster, cost, fixed, now)  # checks, costs, reasons: shared
        fixed = prep.fixed
        self.graph, self.cluster, self.now = graph, cluster, now
        self.w, self.table = prep.w, prep.table
        self.order: list[int] = [i for i in graph.topo if not prep.is_fixed[i]]

        n = len(graph)
        self.finish: list[float] = [0.0] * n
        self.where: list[int] = [-1] * n
        self.placements: dict[str, Placement] = {}
        booked: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for i in sorted(graph.index[t] for t in fixed):
            p = fixed[graph.ids[i]]
            d = cluster.index[p.device_id]
            self.placements[p.task_id] = p
            self.finish[i], self.where[i] = p.finish, d
            booked.setdefault((d, p.slot), []).append((p.start, p.finish))
        self.timelines: list[list[SlotTimeline]] = [
            [
                SlotTimeline(now, [*dev.windows(k), *booked.get((d, k), ())])
                for k in range(dev.slots)
            ]
            for d, dev in enumerate(cluster.devices)
        ]
        self.queue_tail: list[list[float]] = [[now] * dev.slots for dev in cluster.devices]

    def usable(self, i: int) -> NDArray[np.bool_]:
        """Devices task i may run on (eligible and with a finite compute time)."""
        out: NDArray[np.bool_] = np.isfinite(self.w[i])
        return out

    def ready(self, i: int) -> NDArray[np.float64]:
        """Per device: when all of task i's inputs have arrived there (never before `now`)."""
        drt = np.full(len(self.cluster), self.now, dtype=np.float64)
        for p, nbytes in self.graph.preds[i]:
            arrival = self.table.row(nbytes, self.where[p])
            arrival += self.finish[p]
            np.maximum(drt, arrival, out=drt)
        return drt

    def slot_start(self, d: int, ready: float, duration: float) -> tuple[int, float]:
        """(slot, start) of the earliest start on device d behind each slot's queue;
        ties go to the lower slot."""
        best_k, best_s = 0, math.inf
        for k, tl in enumerate(self.timelines[d]):
            s = tl.earliest_start(max(ready, self.queue_tail[d][k]), duration)
            if s < best_s:
                best_k, best_s = k, s
        return best_k, best_s

    def place(self, i: int, d: int, k: int, start: float) -> None:
        end = start + float(self.w[i, d])
        self.timelines[d][k].book(start, end)
        tail = self.queue_tail[d]
        tail[k] = max(tail[k], end)
        self.finish[i], self.where[i] = end, d
        tid = self.graph.ids[i]
        self.placements[tid] = Placement(tid, self.cluster.ids[d], k, start, end)

    def place_on(self, i: int, d: int, ready: NDArray[np.float64]) -> None:
        """Place task i on device d at its earliest start there."""
        k, s = self.slot_start(d, float(ready[d]), float(self.w[i, d]))
        self.place(i, d, k, s)

    def fixed_load(self) -> NDArray[np.float64]:
        """Per device: fixed work still to run after `now` (what a running pod still holds)."""
        load = np.zeros(len(self.cluster), dtype=np.float64)
        for p in self.placements.values():
            left = p.finish - max(p.start, self.now)
            if left > 0:
                load[self.cluster.index[p.device_id]] += left
        return load

    def plan(self, algorithm: str) -> Plan:
        return Plan(placements=dict(self.placements), algorithm=algorithm)
