"""Random scheduling problems for property tests (hypothesis strategies) and small helpers."""

from __future__ import annotations

import importlib
import math
import random
from dataclasses import dataclass, replace

import pytest
from hypothesis import strategies as st

from orchestrator.scheduling import (
    Cluster,
    CostModel,
    Device,
    Link,
    LinkCostModel,
    MatrixCostModel,
    Task,
    TaskGraph,
    ineligibility,
)
from orchestrator.scheduling.engine import Prepared
from orchestrator.scheduling.plan import Plan
from orchestrator.scheduling.portfolio import Candidate

KINDS = ("cpu", "gpu", "npu")
TIERS = ("edge", "fog", "cloud")


class PlainCostModel:
    """Only the two protocol methods: forces the scheduler's per-pair fallback path."""

    def __init__(self, inner: LinkCostModel) -> None:
        self.inner = inner

    def compute_time(self, task: Task, device: Device) -> float:
        slow = 1.5 if device.kind == "npu" else 1.0
        return task.work * slow / device.speed

    def transfer_time(self, nbytes: float, src: Device, dst: Device) -> float:
        return self.inner.transfer_time(nbytes, src, dst)


@dataclass
class Problem:
    graph: TaskGraph
    cluster: Cluster
    cost: CostModel
    now: float
    flavour: str


def _windows(rng: random.Random) -> tuple[tuple[float, float], ...]:
    out = []
    for _ in range(rng.choice([0, 0, 1, 2])):
        s = rng.uniform(0, 30)
        out.append((s, s + rng.choice([0.0, rng.uniform(0, 8)])))
    return tuple(out)


def random_cluster(rng: random.Random, n: int, busy: bool = True) -> Cluster:
    n_sites = rng.randint(1, 3)
    devices = []
    for d in range(n):
        site = f"s{rng.randrange(n_sites)}"
        devices.append(
            Device(
                id=f"d{d}",
                agent_id=f"{site}-a{rng.randrange(3)}",
                site=site,
                tier=rng.choice(TIERS),
                kind=rng.choice(KINDS),
                slots=rng.randint(1, 3),
                memory_mb=rng.choice([512.0, 2048.0, 8192.0]),
                speed=rng.uniform(0.25, 4.0),
                labels=rng.choice([{}, {"zone": "a"}, {"zone": "b"}]),
                busy=_windows(rng) if busy else (),
            )
        )
    return Cluster(devices)


def random_task(rng: random.Random, i: int, cluster: Cluster) -> Task:
    """Mostly unconstrained; constrained tasks usually fit at least one device (`dev`)."""
    kinds: frozenset[str] = frozenset()
    tiers: frozenset[str] = frozenset()
    memory = 0.0
    labels: dict[str, str] = {}
    pinned = None
    if rng.random() < 0.2:
        dev = rng.choice(cluster.devices)
        if rng.random() < 0.5:
            kinds = frozenset({dev.kind, rng.choice(KINDS)})
        if rng.random() < 0.3:
            tiers = frozenset({dev.tier})
        if rng.random() < 0.3:
            memory = rng.choice([0.0, 1024.0, 4096.0, dev.memory_mb])
        if rng.random() < 0.3:
            labels = dict(dev.labels)
        if rng.random() < 0.2:
            pinned = rng.choice([dev.id, dev.agent_id])
        if rng.random() < 0.05:
            pinned = "nowhere"
    work = rng.choice([0.0, rng.uniform(0.01, 10.0), rng.uniform(0.01, 10.0)])
    return Task(f"t{i}", work, kinds, tiers, memory, labels, pinned)


def random_problem(
    rng: random.Random,
    n_tasks: int,
    n_devices: int,
    flavour: str,
    now: float,
    busy: bool = True,
    constrained: bool = True,
) -> Problem:
    cluster = random_cluster(rng, n_devices, busy)
    if constrained:
        tasks = [random_task(rng, i, cluster) for i in range(n_tasks)]
    else:
        tasks = [Task(f"t{i}", rng.choice([0.0, rng.uniform(0.01, 10.0)])) for i in range(n_tasks)]
    p = rng.uniform(0.0, 0.5)
    scale = 1e-6 if flavour == "matrix" else 1.0
    edges = {
        (f"t{i}", f"t{j}"): scale * rng.choice([0.0, 1e3, 1e6, 5e7])
        for j in range(n_tasks)
        for i in range(j)
        if rng.random() < p
    }
    rng.shuffle(tasks)  # index order is not always a topological order
    graph = TaskGraph(tasks, edges)
    sites = sorted(cluster.sites)
    links = {
        (a, b): Link(rng.uniform(0, 0.2), rng.uniform(1e5, 1e9))
        for a in sites
        for b in sites
        if rng.random() < 0.25
    }
    link_model = LinkCostModel(links, local_Bps=rng.choice([1e8, 10e9]))
    cost: CostModel
    if flavour == "link":
        cost = link_model
    elif flavour == "plain":
        cost = PlainCostModel(link_model)
    else:
        cost = MatrixCostModel(
            {
                t.id: {d.id: rng.uniform(0, 20) for d in cluster.devices if rng.random() < 0.95}
                for t in tasks
            }
        )
    return Problem(graph, cluster, cost, now, flavour)


@st.composite
def problems(
    draw: st.DrawFn,
    max_tasks: int = 14,
    max_devices: int = 6,
    busy: bool = True,
    constrained: bool | None = True,
) -> Problem:
    """Sizes, cost-model flavour and `now` come from hypothesis; the details from a seed.
    `busy=False`: no device has busy windows; `constrained=False`: no task has constraints
    (None: hypothesis picks)."""
    return random_problem(
        random.Random(draw(st.integers(0, 2**32 - 1))),
        draw(st.integers(1, max_tasks)),
        draw(st.integers(1, max_devices)),
        draw(st.sampled_from(["link", "matrix", "plain"])),
        draw(st.sampled_from([0.0, 0.0, 3.5])),
        busy,
        draw(st.booleans()) if constrained is None else constrained,
    )


def usable(task: Task, device: Device, cost: CostModel) -> bool:
    return ineligibility(task, device) is None and math.isfinite(cost.compute_time(task, device))


def critical_path(graph: TaskGraph, cluster: Cluster, cost: CostModel) -> float:
    """Longest path with each task at its fastest usable compute time and free transfers."""
    best: dict[str, float] = {}
    for tid in graph.topological_order():
        task = graph.task(tid)
        fastest = min(cost.compute_time(task, d) for d in cluster if usable(task, d, cost))
        start = max((best[p] for p in graph.predecessors(tid)), default=0.0)
        best[tid] = start + fastest
    return max(best.values(), default=0.0)


def closed_subset(pb: Problem, seed: int) -> list[str]:
    """A random subset of tasks closed under predecessors (what may be `fixed`), sorted."""
    rng = random.Random(seed)
    picked = {t for t in pb.graph.ids if rng.random() < 0.4}
    stack = list(picked)
    while stack:
        for p in pb.graph.predecessors(stack.pop()):
            if p not in picked:
                picked.add(p)
                stack.append(p)
    return sorted(picked)


def spy_candidates(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the portfolio note, in order, the name of each candidate it runs beyond HEFT."""
    portfolio_module = importlib.import_module("orchestrator.scheduling.portfolio")
    ran: list[str] = []

    def spy(c: Candidate) -> Candidate:
        def run(p: Prepared) -> Plan:
            ran.append(c.name)
            return c.run(p)

        return replace(c, run=run)

    real: tuple[Candidate, ...] = portfolio_module.TIME_CANDIDATES
    monkeypatch.setattr(portfolio_module, "TIME_CANDIDATES", tuple(spy(c) for c in real))
    return ran
