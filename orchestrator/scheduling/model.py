"""What the scheduler reasons about: tasks, devices, links, the task graph and the cluster.

Everything here is an immutable snapshot; the graph and the cluster precompute index-based
arrays once so the algorithms can work on integers and numpy vectors instead of ids.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True, slots=True)
class Task:
    """One unit of work; `work` is its duration in seconds on a device of speed 1.0."""

    id: str
    work: float = 1.0
    kinds: frozenset[str] = frozenset()
    tiers: frozenset[str] = frozenset()
    min_memory_mb: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    pinned: str | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.work) and self.work >= 0):
            raise ValueError(f"task {self.id!r}: work must be finite and >= 0, got {self.work}")
        if not isinstance(self.kinds, frozenset):
            object.__setattr__(self, "kinds", frozenset(self.kinds))
        if not isinstance(self.tiers, frozenset):
            object.__setattr__(self, "tiers", frozenset(self.tiers))


@dataclass(frozen=True, slots=True)
class Device:
    """A place tasks run; each of its `slots` is an independent timeline."""

    id: str
    agent_id: str
    site: str
    tier: str = "edge"
    kind: str = "cpu"
    slots: int = 1
    memory_mb: float = 1e9
    speed: float = 1.0
    labels: Mapping[str, str] = field(default_factory=dict)
    cost_per_hour: float = 0.0
    busy: tuple[tuple[float, float], ...] = ()
    #: Windows booked on one slot only: (slot, start, end); e.g. other pipelines' reservations.
    slot_busy: tuple[tuple[int, float, float], ...] = ()

    def with_slot_busy(
        self, windows: tuple[tuple[int, float, float], ...], *, check: bool = True
    ) -> Device:
        """This device with `windows` as its per-slot busy windows, checked as in
        `__post_init__` (`check=False`: the caller built them as (int slot below `slots`,
        finite start <= finite end)), without `dataclasses.replace` re-checking everything
        else: the orchestrator overlays reservations on every plan."""
        per_slot = windows
        if check:
            per_slot = tuple((int(k), float(s), float(e)) for k, s, e in windows)
            for k, s, e in per_slot:
                if not (0 <= k < self.slots and math.isfinite(s) and math.isfinite(e) and s <= e):
                    raise ValueError(f"device {self.id!r}: bad slot window ({k}, {s}, {e})")
        out = object.__new__(Device)
        for name in Device.__slots__:
            object.__setattr__(out, name, getattr(self, name))
        object.__setattr__(out, "slot_busy", per_slot)
        return out

    def windows(self, slot: int) -> list[tuple[float, float]]:
        """Everything that blocks `slot`: device-wide busy windows and that slot's own."""
        return [*self.busy, *((s, e) for k, s, e in self.slot_busy if k == slot)]

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"device {self.id!r}: slots must be >= 1, got {self.slots}")
        if not (math.isfinite(self.speed) and self.speed > 0):
            raise ValueError(f"device {self.id!r}: speed must be finite and > 0")
        busy = tuple((float(s), float(e)) for s, e in self.busy)
        for s, e in busy:
            if not (math.isfinite(s) and math.isfinite(e) and s <= e):
                raise ValueError(f"device {self.id!r}: bad busy window ({s}, {e})")
        object.__setattr__(self, "busy", busy)
        per_slot = tuple((int(k), float(s), float(e)) for k, s, e in self.slot_busy)
        for k, s, e in per_slot:
            if not (0 <= k < self.slots and math.isfinite(s) and math.isfinite(e) and s <= e):
                raise ValueError(f"device {self.id!r}: bad slot window ({k}, {s}, {e})")
        object.__setattr__(self, "slot_busy", per_slot)


@dataclass(frozen=True, slots=True)
class Link:
    """A network path: transfer time is `latency_s + bytes / bandwidth_Bps`."""

    latency_s: float
    bandwidth_Bps: float
    cost_per_gb: float = 0.0

    def __post_init__(self) -> None:
        if not (self.latency_s >= 0 and self.bandwidth_Bps > 0):
            raise ValueError("link needs latency_s >= 0 and bandwidth_Bps > 0")


def constraint_signature(task: Task) -> tuple[object, ...]:
    """Tasks with equal signatures are eligible on exactly the same devices."""
    if (
        task.pinned is None
        and not (task.kinds or task.tiers or task.labels)
        and task.min_memory_mb == 0.0
    ):
        return ()  # the common unconstrained task, without building the full key
    return (
        task.pinned,
        task.kinds,
        task.tiers,
        task.min_memory_mb,
        tuple(sorted(task.labels.items())),
    )


class GraphArrays(NamedTuple):
    """The edges as index arrays (in `TaskGraph.edges` order) and each task's topological
    position, for compiled loops."""

    src: NDArray[np.int64]
    dst: NDArray[np.int64]
    nbytes: NDArray[np.float64]
    topo_pos: NDArray[np.int64]


class TaskGraph:
    """A validated DAG of tasks; edges map (src, dst) to the bytes src sends to dst.

    Tasks are addressed by their position in `tasks` (the index); `preds[i]`/`succs[i]` hold
    (index, bytes) pairs and `topo` is a topological order that prefers lower indices.
    """

    __slots__ = (
        "arrays",
        "constraint_groups",
        "edges",
        "ids",
        "index",
        "preds",
        "succs",
        "tasks",
        "topo",
    )

    def __init__(self, tasks: Sequence[Task], edges: Mapping[tuple[str, str], float]) -> None:
        self.tasks: tuple[Task, ...] = tuple(tasks)
        self.ids: tuple[str, ...] = tuple(t.id for t in self.tasks)
        self.index: dict[str, int] = {}
        for i, tid in enumerate(self.ids):
            if tid in self.index:
                raise ValueError(f"duplicate task id {tid!r}")
            self.index[tid] = i
        n = len(self.tasks)
        preds: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        succs: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        self.edges: dict[tuple[str, str], float] = {}
        pairs: list[tuple[int, int]] = []
        for (src, dst), nbytes in edges.items():
            for end in (src, dst):
                if end not in self.index:
                    raise ValueError(f"edge ({src!r}, {dst!r}) references unknown task {end!r}")
            if src == dst:
                raise ValueError(f"self-loop on task {src!r}")
            b = float(nbytes)
            if not (math.isfinite(b) and b >= 0):
                raise ValueError(f"edge ({src!r}, {dst!r}): bytes must be finite and >= 0")
            self.edges[(src, dst)] = b
            i, j = self.index[src], self.index[dst]
            succs[i].append((j, b))
            preds[j].append((i, b))
            pairs.append((i, j))
        self.preds: tuple[tuple[tuple[int, float], ...], ...] = tuple(
            tuple(sorted(p)) for p in preds
        )
        self.succs: tuple[tuple[tuple[int, float], ...], ...] = tuple(
            tuple(sorted(s)) for s in succs
        )
        self.topo: tuple[int, ...] = self._toposort()
        topo_pos = np.empty(n, dtype=np.int64)
        topo_pos[list(self.topo)] = np.arange(n, dtype=np.int64)
        self.arrays = GraphArrays(
            np.fromiter((i for i, _ in pairs), np.int64, len(pairs)),
            np.fromiter((j for _, j in pairs), np.int64, len(pairs)),
            np.fromiter(self.edges.values(), np.float64, len(pairs)),
            topo_pos,
        )
        groups: dict[tuple[object, ...], list[int]] = {}
        for i, task in enumerate(self.tasks):
            groups.setdefault(constraint_signature(task), []).append(i)
        #: tasks with the same constraints (so the same eligible devices), as index arrays
        self.constraint_groups: tuple[NDArray[np.int64], ...] = tuple(
            np.asarray(g, dtype=np.int64) for g in groups.values()
        )

    def _toposort(self) -> tuple[int, ...]:
        indeg = [len(p) for p in self.preds]
        heap = [i for i, d in enumerate(indeg) if d == 0]
        heapq.heapify(heap)
        order: list[int] = []
        while heap:
            i = heapq.heappop(heap)
            order.append(i)
            for j, _ in self.succs[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    heapq.heappush(heap, j)
        if len(order) != len(self.tasks):
            stuck = sorted(self.ids[i] for i, d in enumerate(indeg) if d > 0)
            shown = ", ".join(repr(s) for s in stuck[:10])
            raise ValueError(f"task graph has a cycle through some of: {shown}")
        return tuple(order)

    def __len__(self) -> int:
        return len(self.tasks)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self.index

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    def task(self, task_id: str) -> Task:
        return self.tasks[self.index[task_id]]

    def predecessors(self, task_id: str) -> list[str]:
        return [self.ids[j] for j, _ in self.preds[self.index[task_id]]]

    def successors(self, task_id: str) -> list[str]:
        return [self.ids[j] for j, _ in self.succs[self.index[task_id]]]

    def topological_order(self) -> list[str]:
        return [self.ids[i] for i in self.topo]


def _codes(values: Sequence[str]) -> tuple[dict[str, int], NDArray[np.int64]]:
    table: dict[str, int] = {}
    codes = np.fromiter((table.setdefault(v, len(table)) for v in values), np.int64, len(values))
    return table, codes


class Cluster:
    """A snapshot of the devices, with per-attribute arrays (codes) for vectorised filters."""

    __slots__ = (
        "agent_codes",
        "agent_members",
        "agents",
        "any_busy",
        "devices",
        "ids",
        "index",
        "kind_codes",
        "kinds",
        "label_codes",
        "memory",
        "min_memory",
        "n_slots",
        "site_codes",
        "sites",
        "slot_base",
        "slot_counts",
        "slots",
        "speed",
        "tier_codes",
        "tiers",
    )

    def __init__(self, devices: Sequence[Device]) -> None:
        self.devices: tuple[Device, ...] = tuple(devices)
        self.ids: tuple[str, ...] = tuple(d.id for d in self.devices)
        self.index: dict[str, int] = {}
        for i, did in enumerate(self.ids):
            if did in self.index:
                raise ValueError(f"duplicate device id {did!r}")
            self.index[did] = i
        n = len(self.devices)
        self.speed = np.fromiter((d.speed for d in self.devices), np.float64, n)
        self.memory = np.fromiter((d.memory_mb for d in self.devices), np.float64, n)
        #: the least memory of any device (a task needing no more may run on every one)
        self.min_memory = float(self.memory.min()) if n else math.inf
        self.slots: tuple[int, ...] = tuple(d.slots for d in self.devices)
        self.n_slots = sum(self.slots)
        self.slot_counts = np.asarray(self.slots, dtype=np.int64).reshape(n)
        #: index of each device's first slot when all slots are numbered in device order
        self.slot_base = np.zeros(n, dtype=np.int64)
        np.cumsum(self.slot_counts[:-1], out=self.slot_base[1:])
        #: whether any device has busy windows (planning skips looking for them when not)
        self.any_busy = _any_busy(self.devices)
        self.kinds, self.kind_codes = _codes([d.kind for d in self.devices])
        self.tiers, self.tier_codes = _codes([d.tier for d in self.devices])
        self.sites, self.site_codes = _codes([d.site for d in self.devices])
        self.agents, self.agent_codes = _codes([d.agent_id for d in self.devices])
        members: dict[str, list[int]] = {}
        for i, d in enumerate(self.devices):
            members.setdefault(d.agent_id, []).append(i)
        self.agent_members: dict[str, NDArray[np.int64]] = {
            a: np.asarray(m, dtype=np.int64) for a, m in members.items()
        }
        # label key -> (value -> code, per-device code; -1 where the device lacks the key)
        self.label_codes: dict[str, tuple[dict[str, int], NDArray[np.int64]]] = {}
        for i, d in enumerate(self.devices):
            for key, value in d.labels.items():
                if key not in self.label_codes:
                    self.label_codes[key] = ({}, np.full(n, -1, dtype=np.int64))
                table, codes = self.label_codes[key]
                codes[i] = table.setdefault(value, len(table))

    def with_slot_busy(
        self, extra: Mapping[int, tuple[tuple[int, float, float], ...]], *, check: bool = True
    ) -> Cluster:
        """This cluster with per-slot busy windows set on some devices (by index; `check` as
        in `Device.with_slot_busy`).

        Only busy windows differ, so the copy shares every array and index of this one: the
        orchestrator overlays live reservations on each request without rebuilding them.
        """
        out = object.__new__(Cluster)
        for name in Cluster.__slots__:
            setattr(out, name, getattr(self, name))
        devices = list(self.devices)
        for i, windows in extra.items():
            devices[i] = devices[i].with_slot_busy(windows, check=check)
        out.devices = tuple(devices)
        out.any_busy = _any_busy(out.devices)
        return out

    def __len__(self) -> int:
        return len(self.devices)

    def __contains__(self, device_id: object) -> bool:
        return device_id in self.index

    def __iter__(self) -> Iterator[Device]:
        return iter(self.devices)

    def device(self, device_id: str) -> Device:
        return self.devices[self.index[device_id]]


def _any_busy(devices: Sequence[Device]) -> bool:
    return any(d.busy or d.slot_busy for d in devices)
