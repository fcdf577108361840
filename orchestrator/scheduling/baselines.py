"""Baseline schedulers: what a default cluster scheduler would do, for comparison with HEFT.

Each takes tasks in topological order (ties by topological index) with no ranking or
lookahead, and differs only in how it picks the device:

- `round_robin`: the next usable device in cyclic order (YARN/Kubernetes spreading).
- `least_loaded`: the usable device with the least booked work per slot, blind to
  communication -- the "cores and memory" view of Kubernetes' LeastAllocated scoring.
- `weighted_random`: load-weighted sharding as in the agent-scheduling seed: weights
  1 / (load + 0.1), load decaying by 0.9 each placement; seeded, so reproducible.
- `earliest_start`: Dask-like: the device where the task can start soonest.

All share the signature of `heft` (plus `seed`, used only by `weighted_random`), respect
constraints, slots, busy windows, fixed placements and `now`, raise `Unschedulable` when a task
has no usable device, and never insert a task before one they placed earlier on the same slot
(see `baseline_state`). Times always include transfers, so every plan passes `Plan.validate`
even when the choice ignored them.

A scheduler that keeps placing pipelines carries state across calls: `round_robin` takes the
`cursor` to start from, `least_loaded` and `weighted_random` an initial per-device `load`
(seconds other pipelines have booked), and `weighted_random` a shared `rng`. The simulator's
policies (`sim/policies.py`) use exactly that.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.baseline_state import ListState
from orchestrator.scheduling.cost import CostModel
from orchestrator.scheduling.model import Cluster, TaskGraph
from orchestrator.scheduling.plan import Placement, Plan

DECAY = 0.9
"""`weighted_random`: every device's load is multiplied by this each time a task is placed."""

SMOOTHING = 0.1
"""`weighted_random`: weight = 1 / (load + SMOOTHING), so idle devices get a finite weight."""


def round_robin(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    *,
    fixed: Mapping[str, Placement] | None = None,
    now: float = 0.0,
    seed: int = 0,
    cursor: int = 0,
) -> Plan:
    """Each task to the next usable device after the previous choice, cyclically, the first
    one searched from device `cursor` on."""
    st = ListState(graph, cluster, cost, fixed, now)
    m = len(cluster)
    cursor %= max(m, 1)
    for i in st.order:
        usable = st.usable(i)
        d = next(c % m for c in range(cursor, cursor + m) if usable[c % m])
        st.place_on(i, d, st.ready(i))
        cursor = d + 1
    return st.plan("round-robin")


def least_loaded(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    *,
    fixed: Mapping[str, Placement] | None = None,
    now: float = 0.0,
    seed: int = 0,
    load: NDArray[np.float64] | None = None,
) -> Plan:
    """Each task to the usable device with the least compute time booked per slot so far
    (fixed work still running after `now` counts, plus `load`); ties to the lower index."""
    st = ListState(graph, cluster, cost, fixed, now)
    slots = np.asarray(cluster.slots, dtype=np.float64)
    booked = st.fixed_load() if load is None else st.fixed_load() + load
    for i in st.order:
        per_slot = np.where(st.usable(i), booked / slots, np.inf)
        d = int(per_slot.argmin())
        st.place_on(i, d, st.ready(i))
        booked[d] += st.w[i, d]
    return st.plan("least-loaded")


def weighted_random(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    *,
    fixed: Mapping[str, Placement] | None = None,
    now: float = 0.0,
    seed: int = 0,
    load: NDArray[np.float64] | None = None,
    rng: np.random.Generator | None = None,
) -> Plan:
    """Each task to a usable device drawn with probability proportional to 1/(load + 0.1);
    after each placement every load decays by 0.9 and the chosen device's load grows by the
    task's compute time there. Loads start at the fixed work still running after `now`, plus
    `load`. One uniform draw per task from `rng` (default: `numpy.random.default_rng(seed)`)."""
    st = ListState(graph, cluster, cost, fixed, now)
    if rng is None:
        rng = np.random.default_rng(seed)
    load = st.fixed_load() if load is None else st.fixed_load() + load
    for i in st.order:
        weights = np.where(st.usable(i), 1.0 / (load + SMOOTHING), 0.0)
        cum = np.cumsum(weights)
        u = float(rng.random()) * float(cum[-1])
        d = min(int(np.searchsorted(cum, u, side="right")), len(cum) - 1)
        while weights[d] == 0.0:  # u landed exactly on a boundary; step back to a usable one
            d -= 1
        st.place_on(i, d, st.ready(i))
        load *= DECAY
        load[d] += st.w[i, d]
    return st.plan("weighted-random")


def earliest_start(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    *,
    fixed: Mapping[str, Placement] | None = None,
    now: float = 0.0,
    seed: int = 0,
) -> Plan:
    """Each task to the (device, slot) where it can start first: data arrival and the slot's
    queue; ties to the device that runs it faster, then the lower index."""
    st = ListState(graph, cluster, cost, fixed, now)
    for i in st.order:
        drt = st.ready(i)
        wi = st.w[i]
        best: tuple[float, float, int] | None = None
        choice = (0, 0.0)
        for d in np.flatnonzero(st.usable(i)).tolist():
            k, s = st.slot_start(d, float(drt[d]), float(wi[d]))
            key = (s, float(wi[d]), d)
            if best is None or key < best:
                best, choice = key, (k, s)
        assert best is not None  # ListState refused tasks with no usable device
        st.place(i, best[2], *choice)
    return st.plan("earliest-start")
