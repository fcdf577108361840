"""Real scientific workflows from WfCommons WfInstances (WfFormat 1.5) as task graphs.

Why: random DAGs are easy to tune but their shapes are invented; the WfInstances traces are
executions of real workflows (Montage, 1000Genome, Epigenomics, ...) with measured runtimes
and file sizes, so they show how a scheduler copes with realistic fan-out, fan-in and data
volumes. The traces are LGPL-3.0 and stay in the shared dataset directory; we only read them.

Mapping (WfFormat 1.5):
- a task is `workflow.specification.tasks[*]`, its `work` the `runtimeInSeconds` of the
  same id in `workflow.execution.tasks` (missing or unusable -> 0);
- an edge is any parent/child pair named by either end (`parents` or `children`); its bytes
  are the total `sizeInBytes` of the files the parent lists in `outputFiles` and the child in
  `inputFiles` (none shared -> 0 bytes, still a dependency).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.scheduling.model import Task, TaskGraph

DATASETS_ENV = "MARS_DATASETS"
"""Environment variable naming the datasets root (the directory holding `wfinstances/`)."""

_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Workflow:
    """One WfInstance: its name and the task graph (work in seconds, edge weights in bytes)."""

    name: str
    graph: TaskGraph

    @property
    def total_work(self) -> float:
        """Sum of all task runtimes, in seconds on the traced machines."""
        return sum(t.work for t in self.graph.tasks)

    @property
    def total_bytes(self) -> float:
        """Sum of the bytes on all edges (a file read by k children counts k times)."""
        return sum(self.graph.edges.values())


def wfinstance_dir(root: str | os.PathLike[str] | None = None) -> Path:
    """Where the WfInstance JSON files are.

    `root` (or else `$MARS_DATASETS`, or else `<repo>/../shared/datasets`) is the datasets
    root; if it has a `wfinstances/` subdirectory that is used, otherwise `root` itself.
    """
    if root is None:
        env = os.environ.get(DATASETS_ENV)
        base = Path(env) if env else _REPO.parent / "shared" / "datasets"
    else:
        base = Path(root)
    sub = base / "wfinstances"
    return sub if sub.is_dir() else base


def wfinstance_paths(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """The WfInstance JSON files, sorted by name; empty when the directory is absent."""
    where = wfinstance_dir(root)
    if not where.is_dir():
        return []
    return sorted(where.glob("*.json"))


def _runtime(entry: Mapping[str, Any]) -> float:
    value = entry.get("runtimeInSeconds")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    x = float(value)
    return x if math.isfinite(x) and x > 0 else 0.0


def _require_list(obj: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = obj.get(key, [])
    if not isinstance(value, list):
        raise ValueError(f"{where}: {key!r} must be a list")
    return value


def parse_wfinstance(doc: Mapping[str, Any], name: str | None = None) -> Workflow:
    """Build a Workflow from a parsed WfFormat 1.5 document (see the module doc)."""
    try:
        spec = doc["workflow"]["specification"]
        spec_tasks = _require_list(spec, "tasks", "specification")
        spec_files = _require_list(spec, "files", "specification")
    except (KeyError, TypeError) as exc:
        version = doc.get("schemaVersion", "?") if isinstance(doc, Mapping) else "?"
        raise ValueError(
            f"not a WfFormat 1.5 instance (schemaVersion {version}): missing {exc}"
        ) from exc
    execution = doc["workflow"].get("execution") or {}
    runtimes = {
        str(e["id"]): _runtime(e)
        for e in _require_list(execution, "tasks", "execution")
        if isinstance(e, Mapping) and "id" in e
    }
    size = {
        str(f["id"]): float(f.get("sizeInBytes") or 0.0)
        for f in spec_files
        if isinstance(f, Mapping) and "id" in f
    }
    by_id: dict[str, Mapping[str, Any]] = {}
    for t in spec_tasks:
        if not isinstance(t, Mapping) or "id" not in t:
            raise ValueError("every specification task needs an 'id'")
        by_id[str(t["id"])] = t

    pairs: set[tuple[str, str]] = set()
    for tid, t in by_id.items():
        pairs.update((str(p), tid) for p in _require_list(t, "parents", tid))
        pairs.update((tid, str(c)) for c in _require_list(t, "children", tid))
    edges: dict[tuple[str, str], float] = {}
    for src, dst in sorted(pairs):
        if src not in by_id or dst not in by_id:
            missing = src if src not in by_id else dst
            raise ValueError(f"edge ({src!r}, {dst!r}) names unknown task {missing!r}")
        outputs = {str(f) for f in _require_list(by_id[src], "outputFiles", src)}
        inputs = {str(f) for f in _require_list(by_id[dst], "inputFiles", dst)}
        edges[(src, dst)] = sum(size.get(f, 0.0) for f in outputs & inputs)

    tasks = [Task(tid, work=runtimes.get(tid, 0.0)) for tid in by_id]
    label = name if name is not None else str(doc.get("name", "workflow"))
    return Workflow(name=label, graph=TaskGraph(tasks, edges))


def load_wfinstance(path: str | os.PathLike[str]) -> Workflow:
    """Read one WfInstance JSON file; the Workflow is named after the file (without .json)."""
    p = Path(path)
    with p.open(encoding="utf-8") as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict):
        raise ValueError(f"{p}: top level must be a JSON object")
    return parse_wfinstance(doc, name=p.stem)
