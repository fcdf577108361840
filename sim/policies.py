"""Placement policies the simulator compares, all on the same scheduler core.

A policy plans one pipeline on the cluster as it is now: the cluster's per-slot busy windows
hold everything other pipelines have running or queued there, and `Occupancy` adds per-device
summaries of the same (booked seconds, earliest free slot).

The baselines are the core's (`orchestrator/scheduling/baselines.py`); the classes below only
carry what a cluster scheduler keeps across pipelines -- the round-robin cursor, the random
stream -- and pass every other pipeline's booked work as the starting load, as Kubernetes'
LeastAllocated score and a spreading scheduler do. `earliest_start` already sees the busy
windows, so it is used as is.

Big clusters: `portfolio` and `heft` plan on about `candidates` devices, picked by the core's
pre-filter on a copy of the cluster where each device is busy until its first free slot (so a
fast but fully booked device does not crowd out an idle one). `kube-like` scores only a share
of the feasible devices, as kube-scheduler's default `percentageOfNodesToScore` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling import (
    Cluster,
    CostModel,
    Placement,
    Plan,
    TaskGraph,
    earliest_start,
    heft,
    least_loaded,
    portfolio,
    round_robin,
    weighted_random,
)
from orchestrator.scheduling.baseline_state import ListState
from orchestrator.scheduling.prefilter import prefilter_indices


@dataclass(frozen=True, slots=True)
class Occupancy:
    """Per device of the planning cluster: seconds of other pipelines' work booked after
    `now`, and the earliest time (>= now) one of its slots is free."""

    now: float
    load: NDArray[np.float64]
    free_at: NDArray[np.float64]


class Policy(Protocol):
    name: str

    def plan(
        self,
        graph: TaskGraph,
        cluster: Cluster,
        cost: CostModel,
        *,
        fixed: Mapping[str, Placement],
        now: float,
        occ: Occupancy,
    ) -> Plan: ...


def with_busy(cluster: Cluster, busy: Mapping[int, tuple[tuple[float, float], ...]]) -> Cluster:
    """`cluster` with device-wide busy windows on some devices, sharing its arrays (as
    `Cluster.with_slot_busy` does for per-slot windows; only `devices` differs)."""
    out = object.__new__(Cluster)
    for name in Cluster.__slots__:
        setattr(out, name, getattr(cluster, name))
    devices = list(cluster.devices)
    for i, windows in busy.items():
        devices[i] = replace(devices[i], busy=windows)
    out.devices = tuple(devices)
    return out


def candidate_cluster(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    k: int,
    *,
    fixed: Mapping[str, Placement],
    now: float,
    occ: Occupancy,
) -> Cluster:
    """About `k` devices worth planning on (the core's pre-filter, ranking each device as
    if busy until its first free slot); `cluster` itself when it is that small."""
    if len(cluster) <= k:
        return cluster
    waiting = np.flatnonzero(occ.free_at > now).tolist()
    ranked = with_busy(cluster, {d: ((now, float(occ.free_at[d])),) for d in waiting})
    idx = prefilter_indices(graph, ranked, cost, k, fixed=fixed, now=now)
    return Cluster([cluster.devices[d] for d in idx.tolist()])


@dataclass(slots=True)
class Portfolio:
    """Our scheduler: the core's portfolio (HEFT, PEFT, CPOP and variants; best plan kept)."""

    budget_s: float = 0.05
    candidates: int = 64
    name: str = "portfolio"

    def plan(
        self,
        graph: TaskGraph,
        cluster: Cluster,
        cost: CostModel,
        *,
        fixed: Mapping[str, Placement],
        now: float,
        occ: Occupancy,
    ) -> Plan:
        sub = candidate_cluster(
            graph, cluster, cost, self.candidates, fixed=fixed, now=now, occ=occ
        )
        return portfolio(graph, sub, cost, fixed=fixed, now=now, budget_s=self.budget_s)


@dataclass(slots=True)
class Heft:
    """Plain HEFT with insertion, on the same candidate devices as the portfolio."""

    candidates: int = 64
    name: str = "heft"

    def plan(
        self,
        graph: TaskGraph,
        cluster: Cluster,
        cost: CostModel,
        *,
        fixed: Mapping[str, Placement],
        now: float,
        occ: Occupancy,
    ) -> Plan:
        sub = candidate_cluster(
            graph, cluster, cost, self.candidates, fixed=fixed, now=now, occ=occ
        )
        return heft(graph, sub, cost, fixed=fixed, now=now)


@dataclass(slots=True)
class EarliestStart:
    """Dask-like: each task where it can start first (the core's `earliest_start`)."""

    name: str = "earliest-start"

    def plan(
        self,
        graph: TaskGraph,
        cluster: Cluster,
        cost: CostModel,
        *,
        fixed: Mapping[str, Placement],
        now: float,
        occ: Occupancy,
    ) -> Plan:
        return earliest_start(graph, cluster, cost, fixed=fixed, now=now)


@dataclass(slots=True)
class RoundRobin:
    """Each task to the next usable device after the previous choice, the cursor kept
    across pipelines (YARN/Kubernetes-style spreading)."""

    cursor: int = 0
    name: str = "round-robin"

    def plan(
        self,
        graph: TaskGraph,
        cluster: Cluster,
        cost: CostModel,
        *,
        fixed: Mapping[str, Placement],
        now: float,
        occ: Occupancy,
    ) -> Plan:
        out = round_robin(graph, cluster, cost, fixed=fixed, now=now, cursor=self.cursor)
        placed = [p for tid, p in out.placements.items() if tid not in fixed]
        if placed:  # placements are in the order they were made
            self.cursor = cluster.index[placed[-1].device_id] + 1
        return out


@dataclass(slots=True)
class LeastLoaded:
    """The "traditional" scheduler: each task to the usable device with the least booked
    compute per slot, counting every pipeline's work (Kubernetes LeastAllocated), blind to
    data movement."""

    name: str = "least-loaded"

    def plan(
        self,
        graph: TaskGraph,
        cluster: Cluster,
        cost: CostModel,
        *,
        fixed: Mapping[str, Placement],
        now: float,
        occ: Occupancy,
    ) -> Plan:
        return least_loaded(graph, cluster, cost, fixed=fixed, now=now, load=occ.load)


@dataclass(slots=True)
class WeightedRandom:
    """Load-weighted random sharding (weights 1/(load + 0.1), loads decaying by 0.9 per
    placement), with every pipeline's booked work as the starting load; seeded, one random
    stream across pipelines."""

    seed: int = 0
    name: str = "weighted-random"
    rng: np.random.Generator | None = None

    def plan(
        self,
        graph: TaskGraph,
        cluster: Cluster,
        cost: CostModel,
        *,
        fixed: Mapping[str, Placement],
        now: float,
        occ: Occupancy,
    ) -> Plan:
        if self.rng is None:
            self.rng = np.random.default_rng(self.seed)
        return weighted_random(
            graph, cluster, cost, fixed=fixed, now=now, load=occ.load, rng=self.rng
        )


MIN_FEASIBLE_NODES = 100
"""kube-scheduler's `minFeasibleNodesToFind`: it looks for at least this many feasible nodes."""

MIN_PERCENTAGE = 5
"""kube-scheduler's floor of the adaptive percentage of nodes to score."""


def nodes_to_score(nodes: int, percentage: int = 0) -> int:
    """How many feasible nodes kube-scheduler looks for before it scores (its
    `numFeasibleNodesToFind`): every node up to 100; else `percentage` of them (0, the
    default: adaptive, 50 - nodes/125 in integers, at least 5), but at least 100."""
    if nodes < MIN_FEASIBLE_NODES or percentage >= 100:
        return nodes
    pct = percentage
    if pct <= 0:
        pct = max(MIN_PERCENTAGE, 50 - nodes // 125)
    return max(MIN_FEASIBLE_NODES, nodes * pct // 100)


@dataclass(slots=True)
class KubeLike:
    """kube-scheduler's default cycle, per task (a pod) over devices (nodes): filter, then
    score only the first `nodes_to_score(all devices)` feasible ones met from a start index
    that rotates by the devices looked at (its `nextStartNodeIndex`), by free capacity
    (LeastAllocated: the least booked compute per slot, every pipeline's work counted); the
    best score wins, ties to the first one met. Feasible = the task may run there (kind,
    memory); like the real one, it ignores device speed and where the data is."""

    percentage: int = 0
    start: int = 0
    scored: list[int] | None = None
    """When a list: the number of devices scored for each task is appended (for tests)."""
    name: str = "kube-like"

    def plan(
        self,
        graph: TaskGraph,
        cluster: Cluster,
        cost: CostModel,
        *,
        fixed: Mapping[str, Placement],
        now: float,
        occ: Occupancy,
    ) -> Plan:
        st = ListState(graph, cluster, cost, fixed, now)
        m = len(cluster)
        want = nodes_to_score(m, self.percentage)
        slots = np.asarray(cluster.slots, dtype=np.float64)
        booked = st.fixed_load() + occ.load
        start = self.start % max(m, 1)
        for i in st.order:
            order = np.roll(np.arange(m), -start)
            feasible = np.flatnonzero(st.usable(i)[order])
            found = feasible[:want]
            looked = int(found[-1]) + 1 if len(found) == want else m
            cand = order[found]
            d = int(cand[int(np.argmin(booked[cand] / slots[cand]))])
            if self.scored is not None:
                self.scored.append(len(cand))
            st.place_on(i, d, st.ready(i))
            booked[d] += st.w[i, d]
            start = (start + looked) % m
        self.start = start
        return st.plan("kube-like")


POLICIES = (
    "portfolio",
    "heft",
    "kube-like",
    "least-loaded",
    "round-robin",
    "weighted-random",
    "earliest-start",
)


def make_policy(name: str, *, seed: int = 0, candidates: int = 64) -> Policy:
    """A fresh policy by name (state such as a round-robin cursor starts anew)."""
    if name == "portfolio":
        return Portfolio(candidates=candidates)
    if name == "heft":
        return Heft(candidates=candidates)
    if name == "kube-like":
        return KubeLike()
    if name == "least-loaded":
        return LeastLoaded()
    if name == "round-robin":
        return RoundRobin()
    if name == "weighted-random":
        return WeightedRandom(seed=seed)
    if name == "earliest-start":
        return EarliestStart()
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
