"""Where a task may run, and why not: every refusal carries a human-readable reason.

`ineligibility` is the reference rule for one (task, device) pair; `eligibility_mask` is the
same rule vectorised over a whole cluster (the two are property-tested to agree).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.model import Cluster, Device, Task, TaskGraph


def _fmt_set(values: Iterable[str]) -> str:
    return "{" + ", ".join(sorted(values)) + "}"


def _num(x: float) -> str:
    return f"{x:g}"


def ineligibility(task: Task, device: Device) -> str | None:
    """Why `task` may not run on `device`, or None when it may."""
    if task.pinned is not None and task.pinned not in (device.id, device.agent_id):
        return f"pinned to {task.pinned}"
    if task.kinds and device.kind not in task.kinds:
        return f"kind {device.kind} not in {_fmt_set(task.kinds)}"
    if task.tiers and device.tier not in task.tiers:
        return f"tier {device.tier} not allowed (allowed: {_fmt_set(task.tiers)})"
    if device.memory_mb < task.min_memory_mb:
        return f"memory {_num(device.memory_mb)} < {_num(task.min_memory_mb)} MB"
    for key in sorted(task.labels):
        want = task.labels[key]
        have = device.labels.get(key)
        if have != want:
            extra = "" if have is None else f" (has {key}={have})"
            return f"missing label {key}={want}{extra}"
    return None


def _codes_in(
    table: Mapping[str, int], codes: NDArray[np.int64], allowed: frozenset[str]
) -> NDArray[np.bool_]:
    wanted = [table[v] for v in allowed if v in table]
    return np.isin(codes, np.asarray(wanted, dtype=np.int64))


def eligibility_mask(task: Task, cluster: Cluster) -> NDArray[np.bool_]:
    """Boolean vector over `cluster.devices`: True where `ineligibility` would return None."""
    n = len(cluster)
    mask: NDArray[np.bool_] = cluster.memory >= task.min_memory_mb
    if task.pinned is not None:
        pin = np.zeros(n, dtype=np.bool_)
        if task.pinned in cluster.index:
            pin[cluster.index[task.pinned]] = True
        if task.pinned in cluster.agent_members:
            pin[cluster.agent_members[task.pinned]] = True
        mask &= pin
    if task.kinds:
        mask &= _codes_in(cluster.kinds, cluster.kind_codes, task.kinds)
    if task.tiers:
        mask &= _codes_in(cluster.tiers, cluster.tier_codes, task.tiers)
    for key, want in task.labels.items():
        entry = cluster.label_codes.get(key)
        if entry is None or want not in entry[0]:
            mask[:] = False
            break
        mask &= entry[1] == entry[0][want]
    return mask


def eligible_everywhere(task: Task, cluster: Cluster) -> bool:
    """Whether `eligibility_mask` is True on every device, without building it when memory
    is the task's only limit (the usual task)."""
    if task.pinned is None and not (task.kinds or task.tiers or task.labels):
        return task.min_memory_mb <= cluster.min_memory
    return bool(np.logical_and.reduce(eligibility_mask(task, cluster)))


def eligibility_matrix(graph: TaskGraph, cluster: Cluster) -> NDArray[np.bool_]:
    """tasks x devices eligibility; tasks with identical constraints share one computation."""
    out = np.empty((len(graph), len(cluster)), dtype=np.bool_)
    for rows in graph.constraint_groups:
        out[rows] = eligibility_mask(graph.tasks[int(rows[0])], cluster)
    return out


class Unschedulable(Exception):
    """Some tasks have no device they may run on; `.reasons[task][device]` says why not.

    Not an error in the scheduler: the request cannot be met by this cluster.
    """

    def __init__(self, reasons: Mapping[str, Mapping[str, str]]) -> None:
        self.reasons: dict[str, dict[str, str]] = {t: dict(r) for t, r in reasons.items()}
        super().__init__(self._describe())

    @property
    def no_devices(self) -> bool:
        """The cluster had no device at all (no agent up), not one that said no."""
        return bool(self.reasons) and not any(self.reasons.values())

    def _describe(self, per_task: int = 5) -> str:
        lines = [f"{len(self.reasons)} task(s) have no eligible device:"]
        for task_id, by_device in self.reasons.items():
            if not by_device:
                lines.append(f"  {task_id}: the cluster has no devices")
                continue
            shown = list(by_device.items())[:per_task]
            parts = "; ".join(f"{dev}: {why}" for dev, why in shown)
            more = len(by_device) - len(shown)
            tail = f"; ... and {more} more" if more > 0 else ""
            lines.append(f"  {task_id}: {parts}{tail}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self._describe()

    def __reduce__(self) -> tuple[type[Unschedulable], tuple[dict[str, dict[str, str]]]]:
        return (Unschedulable, (self.reasons,))
