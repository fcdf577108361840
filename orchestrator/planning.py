"""Turn a pipeline spec plus the live cluster into a scheduler problem, and plan it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from orchestrator.predictor import estimate_seconds
from orchestrator.registry import ClusterView
from orchestrator.scheduling import (
    Cluster,
    Device,
    Link,
    LinkCostModel,
    Plan,
    Task,
    TaskGraph,
    TransferTable,
    heft,
)
from schemas.agent import DeviceSpec
from schemas.pipeline import PipelineSpec, SyntheticRun, TaskSpec


def output_bytes(task: TaskSpec) -> int:
    """Bytes a task sends to each consumer: declared, else what a synthetic run emits."""
    if task.output_bytes:
        return task.output_bytes
    if isinstance(task.run, SyntheticRun):
        return task.run.output_bytes
    return 0


def to_graph(spec: PipelineSpec) -> TaskGraph:
    tasks = [
        Task(
            id=t.id,
            work=1.0,
            kinds=frozenset(t.requires.kinds),
            tiers=frozenset(t.requires.tiers),
            min_memory_mb=t.requires.min_memory_mb,
            labels=dict(t.requires.labels),
            pinned=t.requires.pinned_agent,
        )
        for t in spec.tasks
    ]
    by_id = {t.id: t for t in spec.tasks}
    edges = {(d, t.id): float(output_bytes(by_id[d])) for t in spec.tasks for d in t.deps}
    return TaskGraph(tasks, edges)


class SpecCostModel:
    """Compute time from the predictor's prior per (task spec, device spec); links as measured."""

    def __init__(
        self,
        spec: PipelineSpec,
        devices: Mapping[str, DeviceSpec],
        links: Mapping[tuple[str, str], Link],
    ) -> None:
        self.specs = {t.id: t for t in spec.tasks}
        self.devices = devices
        self.links = LinkCostModel(links)
        self._cache: dict[tuple[str, str], float] = {}

    def compute_time(self, task: Task, device: Device) -> float:
        key = (task.id, device.id)
        t = self._cache.get(key)
        if t is None:
            t = estimate_seconds(self.specs[task.id], self.devices[device.id])
            self._cache[key] = t
        return t

    def transfer_time(self, nbytes: float, src: Device, dst: Device) -> float:
        return self.links.transfer_time(nbytes, src, dst)

    def compute_matrix(self, tasks: Sequence[Task], cluster: Cluster) -> NDArray[np.float64]:
        out = np.empty((len(tasks), len(cluster.devices)), dtype=np.float64)
        for i, t in enumerate(tasks):
            for j, d in enumerate(cluster.devices):
                out[i, j] = self.compute_time(t, d)
        return out

    def transfer_table(self, cluster: Cluster) -> TransferTable:
        return self.links.transfer_table(cluster)


@dataclass(frozen=True)
class Planned:
    plan: Plan
    graph: TaskGraph
    cluster: Cluster
    cost: SpecCostModel


def plan_pipeline(spec: PipelineSpec, view: ClusterView, now: float) -> Planned:
    """Plan on the live view; raises scheduling.Unschedulable with per-device reasons."""
    cluster, links = view.snapshot(now)
    devices = {d.id: view.device_spec(d.id)[1] for d in cluster.devices}
    graph = to_graph(spec)
    cost = SpecCostModel(spec, devices, links)
    plan = heft(graph, cluster, cost)
    return Planned(plan, graph, cluster, cost)
