"""Load the published worked examples (Topcuoglu 2002, Arabnejad 2014) as scheduler inputs.

File shape: {"processors": [...], "compute": {task: [time per processor]},
"edges": [[src, dst, comm_time], ...], "published": {...}}.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.scheduling.cost import MatrixCostModel
from orchestrator.scheduling.model import Cluster, Device, Task, TaskGraph


@dataclass(frozen=True, slots=True)
class CanonicalExample:
    graph: TaskGraph
    cluster: Cluster
    cost: MatrixCostModel
    published: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""


def parse_canonical(data: Mapping[str, Any]) -> CanonicalExample:
    processors = [str(p) for p in data["processors"]]
    compute: dict[str, dict[str, float]] = {}
    for task_id, times in data["compute"].items():
        if len(times) != len(processors):
            raise ValueError(f"task {task_id!r}: {len(times)} times for {len(processors)} procs")
        compute[str(task_id)] = {p: float(t) for p, t in zip(processors, times, strict=True)}
    tasks = [Task(id=t) for t in compute]
    edges = {(str(s), str(d)): float(c) for s, d, c in data["edges"]}
    devices = [Device(id=p, agent_id=p, site=p) for p in processors]
    return CanonicalExample(
        graph=TaskGraph(tasks, edges),
        cluster=Cluster(devices),
        cost=MatrixCostModel(compute),
        published=dict(data.get("published", {})),
        source=str(data.get("source", "")),
    )


def load_canonical_example(path: str | Path) -> CanonicalExample:
    """Read one canonical JSON file, keeping its published results and source."""
    with open(path, encoding="utf-8") as fh:
        return parse_canonical(json.load(fh))


def load_canonical(path: str | Path) -> tuple[TaskGraph, Cluster, MatrixCostModel]:
    """Read one canonical JSON file as (graph, cluster, cost), ready for any scheduler."""
    ex = load_canonical_example(path)
    return ex.graph, ex.cluster, ex.cost
