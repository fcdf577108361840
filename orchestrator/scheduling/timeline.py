"""Occupancy of one device slot, for insertion-based scheduling.

A slot is a sorted list of disjoint busy intervals. The first interval is a sentinel
(-inf, now] so nothing is ever placed in the past. Zero-length intervals occupy no time: they
are never booked and never block anything (the rule `Plan.validate` applies too).

`horizon` is where the final contiguous busy block begins: a task ready at or after it can
only go at the end, which lets the scheduler skip the gap search for most (device, task) pairs.
`head` is where the first busy block (the one holding `now`) ends: nothing can start before it.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable


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
