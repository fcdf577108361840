"""Occupancy of device slots, for insertion-based scheduling.

A slot is a sorted list of disjoint busy intervals. The first interval is a sentinel
(-inf, now] so nothing is ever placed in the past. Zero-length intervals occupy no time: they
are never booked and never block anything (the rule `Plan.validate` applies too).

`horizon` is where the final contiguous busy block begins: a task ready at or after it can
only go at the end, which lets the scheduler skip the gap search for most (device, task) pairs.
`head` is where the first busy block (the one holding `now`) ends: nothing can start before it.

`ClusterSlots` holds every slot of a cluster and summarises them per device as numpy vectors
(earliest tail, latest horizon, earliest head) so a scheduler can bound all devices at once.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from orchestrator.scheduling.model import Cluster
    from orchestrator.scheduling.plan import Placement


class SlotTimeline:
    __slots__ = ("finishes", "head", "horizon", "starts")

    def __init__(self, now: float, occupied: Iterable[tuple[float, float]] = ()) -> None:
        starts = [-math.inf]
        finishes = [now]
        for s, f in sorted(occupied):
            if f <= s or f <= finishes[-1]:
                continue
            if s <= finishes[-1]:
                finishes[-1] = f
            else:
                starts.append(s)
                finishes.append(f)
        self.starts = starts
        self.finishes = finishes
        self.horizon = starts[-1]
        self.head = finishes[0]

    @property
    def end(self) -> float:
        """When the slot becomes free for good."""
        return self.finishes[-1]

    def earliest_start(self, ready: float, duration: float, limit: float = math.inf) -> float:
        """Earliest start >= ready of a free window at least `duration` long (first fit).

        With a finite `limit`, the search may give up early and return some start whose finish
        exceeds `limit`; any start returned with finish <= limit is exact.
        """
        if duration <= 0:
            return ready
        if ready >= self.horizon:
            return max(ready, self.finishes[-1])
        starts, finishes = self.starts, self.finishes
        k = bisect_right(finishes, ready)
        s = ready
        n = len(starts)
        while k < n:
            if s + duration <= starts[k]:
                return s
            s = finishes[k]
            if s + duration > limit:
                return s
            k += 1
        return s

    def book(self, start: float, finish: float) -> None:
        """Occupy [start, finish); the window must be free (as found by earliest_start)."""
        if finish <= start:
            return
        starts, finishes = self.starts, self.finishes
        k = bisect_right(finishes, start)
        n = len(starts)
        starts.insert(k, start)
        finishes.insert(k, finish)
        if start <= self.head:
            j, head = k, finish
            while j + 1 <= n and starts[j + 1] <= head:
                j += 1
                head = max(head, finishes[j])
            self.head = head
        if k == n:
            if start > finishes[k - 1]:
                self.horizon = start
            return
        # Inserted into the gap before the old interval k (now at k + 1).
        if starts[k + 1] != self.horizon or finishes[k] < starts[k + 1]:
            return
        if start > finishes[k - 1]:
            self.horizon = start
            return
        j = k - 1
        while j >= 1 and starts[j] <= finishes[j - 1]:
            j -= 1
        self.horizon = starts[j] if j >= 1 else -math.inf


class ClusterSlots:
    """All slot timelines of a cluster plus per-device summaries as numpy vectors.

    A slot with nothing booked is just "free from now", so timelines are built only for
    devices with busy windows or fixed placements, the rest on first use: planning a few
    tasks on a cluster with thousands of slots does not pay for all of them.
    """

    __slots__ = ("_lines", "_now", "_slots", "free_at", "horizon", "tail")

    def __init__(self, cluster: Cluster, now: float, fixed: Mapping[str, Placement]) -> None:
        booked: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for p in fixed.values():
            booked.setdefault((cluster.index[p.device_id], p.slot), []).append((p.start, p.finish))
        touched = {d for d, _ in booked}
        m = len(cluster)
        self._now = now
        self._slots = cluster.slots
        self._lines: list[list[SlotTimeline] | None] = [None] * m
        self.tail = np.full(m, now, dtype=np.float64)
        self.horizon = np.full(m, -math.inf, dtype=np.float64)
        self.free_at = np.full(m, now, dtype=np.float64)
        if not (cluster.any_busy or touched):
            return
        for d, dev in enumerate(cluster.devices):
            if dev.busy or dev.slot_busy or d in touched:
                self._lines[d] = [
                    SlotTimeline(now, [*dev.windows(k), *booked.get((d, k), ())])
                    for k in range(dev.slots)
                ]
                self.refresh(d)

    def timelines(self, d: int) -> list[SlotTimeline]:
        """Device d's slot timelines (built now if nothing touched them yet)."""
        lines = self._lines[d]
        if lines is None:
            lines = self._lines[d] = [SlotTimeline(self._now) for _ in range(self._slots[d])]
        return lines

    def built(self) -> list[tuple[int, list[SlotTimeline]]]:
        """(device, its timelines) for every device whose timelines exist; the rest are
        free from `now` on every slot."""
        return [(d, lines) for d, lines in enumerate(self._lines) if lines is not None]

    def book(self, d: int, k: int, start: float, finish: float) -> None:
        """Occupy [start, finish) on slot k of device d and update the summaries."""
        self.timelines(d)[k].book(start, finish)
        self.refresh(d)

    def refresh(self, d: int) -> None:
        tls = self.timelines(d)
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
        for k, tl in enumerate(self.timelines(d)):
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
