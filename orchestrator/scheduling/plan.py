"""A schedule and the invariants every schedule must satisfy, whichever algorithm made it.

Fixed placements (tasks already finished or running) are facts, not decisions: validate only
checks they are present and unchanged, and that no other task collides with them.
Two windows collide when their intersection has positive length, so a zero-length placement
or busy window never collides with anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from orchestrator.scheduling.constraints import ineligibility
from orchestrator.scheduling.cost import CostModel
from orchestrator.scheduling.model import Cluster, TaskGraph


class Placement(NamedTuple):
    """Where and when one task runs (a named tuple: immutable, and cheap to make by the
    thousand inside the scheduling loop)."""

    task_id: str
    device_id: str
    slot: int
    start: float
    finish: float


class PlanError(ValueError):
    """A plan breaks its invariants; `.violations` lists each breach in words."""

    def __init__(self, violations: list[str]) -> None:
        self.violations = list(violations)
        shown = "\n  ".join(self.violations[:20])
        more = len(self.violations) - 20
        tail = f"\n  ... and {more} more" if more > 0 else ""
        super().__init__(f"{len(self.violations)} plan violation(s):\n  {shown}{tail}")

    def __reduce__(self) -> tuple[type[PlanError], tuple[list[str]]]:
        return (PlanError, (self.violations,))


@dataclass(slots=True)
class Plan:
    """Where and when every task runs. `algorithm` names what made it; `cost` is its price in
    dollars (`money.plan_cost`) when the maker computed it (the portfolio does), else None."""

    placements: dict[str, Placement] = field(default_factory=dict)
    algorithm: str = ""
    cost: float | None = None

    @property
    def makespan(self) -> float:
        return max((p.finish for p in self.placements.values()), default=0.0)

    def by_device(self) -> dict[str, list[Placement]]:
        """Placements grouped per device, in start order (the order an agent runs them)."""
        out: dict[str, list[Placement]] = {}
        for p in sorted(self.placements.values(), key=lambda p: (p.start, p.slot, p.task_id)):
            out.setdefault(p.device_id, []).append(p)
        return out

    def validate(
        self,
        graph: TaskGraph,
        cluster: Cluster,
        cost: CostModel,
        *,
        fixed: Mapping[str, Placement] | None = None,
        now: float = 0.0,
        eps: float = 1e-9,
    ) -> None:
        """Raise PlanError listing every violated invariant; return None for a valid plan."""
        fixed = fixed or {}
        bad: list[str] = []

        def tol(*xs: float) -> float:
            return eps * max(1.0, *(abs(x) for x in xs if math.isfinite(x)))

        for tid, p in self.placements.items():
            if p.task_id != tid:
                bad.append(f"placement keyed {tid!r} is for task {p.task_id!r}")
            if tid not in graph:
                bad.append(f"{tid}: not a task of the graph")
        for tid in graph.ids:
            if tid not in self.placements:
                bad.append(f"{tid}: not placed")
        for tid, fp in fixed.items():
            if self.placements.get(tid) != fp:
                bad.append(
                    f"{tid}: fixed placement changed or missing ({fp} -> "
                    f"{self.placements.get(tid)})"
                )

        slots: dict[tuple[str, int], list[Placement]] = {}
        for tid, p in self.placements.items():
            if p.device_id not in cluster:
                bad.append(f"{tid}: unknown device {p.device_id!r}")
                continue
            dev = cluster.device(p.device_id)
            if not 0 <= p.slot < dev.slots:
                bad.append(f"{tid}: slot {p.slot} out of range on {dev.id} ({dev.slots} slots)")
                continue
            slots.setdefault((dev.id, p.slot), []).append(p)
            if tid in fixed or tid not in graph:
                continue
            task = graph.task(tid)
            why = ineligibility(task, dev)
            if why is not None:
                bad.append(f"{tid}: ineligible on {dev.id}: {why}")
            want = cost.compute_time(task, dev)
            if not math.isfinite(want):
                bad.append(f"{tid}: compute time on {dev.id} is not finite")
            elif abs((p.finish - p.start) - want) > tol(p.start, p.finish, want):
                bad.append(f"{tid}: duration {p.finish - p.start:g} != compute time {want:g}")
            if p.start < now - tol(now):
                bad.append(f"{tid}: starts at {p.start:g}, before now={now:g}")
            for bs, be in dev.windows(p.slot):
                if min(p.finish, be) - max(p.start, bs) > tol(p.finish, be):
                    bad.append(
                        f"{tid}: [{p.start:g}, {p.finish:g}) overlaps busy window "
                        f"[{bs:g}, {be:g}) on {dev.id}"
                    )

        for (dev_id, slot), items in slots.items():
            items.sort(key=lambda p: (p.start, p.finish, p.task_id))
            last = items[0]
            for p in items[1:]:
                clash = min(p.finish, last.finish) - p.start > tol(p.finish, last.finish)
                if clash and not (p.task_id in fixed and last.task_id in fixed):
                    bad.append(f"{p.task_id} and {last.task_id} overlap on {dev_id} slot {slot}")
                if p.finish > last.finish:
                    last = p

        for (src, dst), nbytes in graph.edges.items():
            ps, pd = self.placements.get(src), self.placements.get(dst)
            if ps is None or pd is None or dst in fixed:
                continue
            if ps.device_id not in cluster or pd.device_id not in cluster:
                continue
            delay = cost.transfer_time(
                nbytes, cluster.device(ps.device_id), cluster.device(pd.device_id)
            )
            ready = ps.finish + delay
            if pd.start < ready - tol(ready, pd.start):
                bad.append(
                    f"{dst}: starts at {pd.start:g} before input from {src} arrives "
                    f"at {ready:g} (finish {ps.finish:g} + transfer {delay:g})"
                )
        if bad:
            raise PlanError(bad)
