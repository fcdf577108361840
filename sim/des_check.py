"""Invariants of a simulated execution, checked on the records alone.

Why separate from `Plan.validate`: with noise, slowdowns and re-runs the executed schedule is
not a plan (durations differ from the cost model, a task may have several attempts), yet the
physical rules must still hold. Used by the tests and cheap enough for any scenario.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.scheduling import Cluster, CostModel, TaskGraph
from sim.des import SimResult


def execution_violations(
    result: SimResult,
    graphs: Mapping[int, TaskGraph],
    cluster: Cluster,
    cost: CostModel,
    eps: float = 1e-9,
) -> list[str]:
    """Every breach, in words: two attempts overlapping on one device slot; a task started
    before some attempt of each producer finished and its output could arrive; a task that
    finished without ever being placed; an attempt on a device after that device died."""
    bad: list[str] = []
    per_slot: dict[tuple[str, int], list[tuple[float, float, str]]] = {}
    attempts: dict[tuple[int, str], list[tuple[str, float, float, bool]]] = {}
    died = {cluster.devices[d].id: until for d, (_, _, until) in enumerate(result.capacity)}
    for e in result.executions:
        if e.finish > e.start:
            per_slot.setdefault((e.device_id, e.slot), []).append((e.start, e.finish, e.task_id))
        attempts.setdefault((e.pipeline, e.task_id), []).append(
            (e.device_id, e.start, e.finish, e.killed)
        )
        if e.start > died[e.device_id] + eps:
            bad.append(f"p{e.pipeline}/{e.task_id} started on {e.device_id} after it died")
    for (dev, slot), items in per_slot.items():
        items.sort()
        last_f, last_t = items[0][1], items[0][2]
        for s1, f1, t1 in items[1:]:
            if s1 < last_f - eps * max(1.0, abs(last_f)):
                bad.append(
                    f"{t1} starts at {s1:g} before {last_t} ends ({last_f:g}) on {dev}/{slot}"
                )
            if f1 > last_f:
                last_f, last_t = f1, t1
    for p, graph in graphs.items():
        for (src, dst), nbytes in graph.edges.items():
            for dev, start, _, _ in attempts.get((p, dst), []):
                sources = [a for a in attempts.get((p, src), []) if not a[3]]
                ok = any(
                    f + cost.transfer_time(nbytes, cluster.device(sd), cluster.device(dev))
                    <= start + eps * max(1.0, abs(start))
                    for sd, _, f, _ in sources
                )
                if not ok:
                    bad.append(f"p{p}/{dst} started at {start:g} before input from {src}")
    return bad
