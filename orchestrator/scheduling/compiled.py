"""The earliest-finish loop compiled with numba, for clusters small enough for dense link
matrices (up to 256 devices).

`smallrun.run_small` is already plain float arithmetic, but Python still pays ~10 us per task
for the heap, the per-device lists and the slot search; on small instances that floor is most
of the planning time. This module runs the same loop (same decisions, same floating-point
operations in the same order, so the plans are identical; property tests hold it to the
Python and the numpy loops) over flat arrays, compiled by numba on first use and cached on
disk. Each slot's timeline is a preallocated row with room for every task, so `fits` keeps
requests whose rows would be too large on the Python loops.

numba is optional (`pip install mars[fast]`): without it, or with `MARS_JIT=0` in the
environment, `runner()` returns None and the scheduler uses the Python loop. The first call in
a process without a disk cache compiles (a few seconds); `warm_up()` lets a service pay that
before its first request instead of during it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.constraints import eligible_everywhere
from orchestrator.scheduling.cost import CostModel, is_batch
from orchestrator.scheduling.model import Cluster, TaskGraph
from orchestrator.scheduling.plan import Placement, Plan

if TYPE_CHECKING:
    from orchestrator.scheduling.runstate import RunState
    from orchestrator.scheduling.timeline import ClusterSlots
    from orchestrator.scheduling.transfer import Dense

Runner = Callable[["RunState", Sequence[int], str, "Dense"], Plan]

_module: Any = None
_loaded = False


def _load() -> Any:
    """The numba module, or None where numba is missing or disabled."""
    if os.environ.get("MARS_JIT", "1") == "0":
        return None
    try:
        from orchestrator.scheduling import kernel as module
    except ImportError:
        return None
    return module


def _get() -> Any:
    """The compiled list-scheduling loop (`kernel.kernel`), or None."""
    global _module, _loaded
    if not _loaded:
        _module, _loaded = _load(), True
    return None if _module is None else _module.kernel


#: Most timeline cells (slots x room per slot) the compiled loop allocates per array.
MAX_CELLS = 4_000_000


def fits(n_tasks: int, n_slots: int) -> bool:
    """Whether a request's timelines stay within MAX_CELLS (busy windows aside)."""
    return n_slots * (n_tasks + 2) <= MAX_CELLS


def runner() -> Runner | None:
    """`run_compiled` where numba is available and enabled, else None."""
    return run_compiled if _get() is not None else None


def run_compiled(sched: RunState, keys: Sequence[int], algorithm: str, dense: Dense) -> Plan:
    """`smallrun.run_small` through the compiled kernel (the scheduler is used up by it).

    The kernel gets the edges as index arrays, the compute-time matrix, the dense latency and
    bandwidth matrices, and every slot timeline as a row of (starts, finishes) with room for
    one more interval per task (or no rows when nothing is booked yet: it makes them); it
    returns the placements in the order it made them (the order of `Plan.placements`, as in
    the Python loop): task, slot, start, finish, device.
    """
    prep = sched.prep
    graph, cluster = prep.graph, prep.cluster
    n = len(graph)
    arrays = graph.arrays
    is_fixed = np.zeros(n, dtype=np.bool_)
    if prep.fixed_idx:
        is_fixed[prep.fixed_idx] = True
    st, fi, cnt, hor, head = _timelines(sched.slots, cluster, prep.now, n)
    finish = np.array(sched.finish, dtype=np.float64)
    where = np.array(sched.where, dtype=np.int64)
    lat, bw = dense
    out = _get()(
        np.array(keys, dtype=np.int64), arrays.topo_pos, arrays.src, arrays.dst, arrays.nbytes,
        is_fixed, np.ascontiguousarray(prep.w), np.ascontiguousarray(lat),
        np.ascontiguousarray(bw), float(prep.now), bool(sched.insertion), cluster.slot_base,
        cluster.slot_counts, st, fi, cnt, hor, head, finish, where, len(prep.todo),
    )  # fmt: skip
    _collect(graph, cluster, out, sched.placements)
    return Plan(placements=sched.placements, algorithm=algorithm)


def _collect(graph: TaskGraph, cluster: Cluster, out: Any, into: dict[str, Placement]) -> None:
    """The kernel's placements (task, slot, start, finish, device, in the order made) into
    `into`, in that order."""
    order, out_k, out_s, out_f, out_d = out
    ids, dev_ids = graph.ids, cluster.ids
    tids = [ids[i] for i in order.tolist()]
    devs = [dev_ids[d] for d in out_d.tolist()]
    rows = zip(tids, devs, out_k.tolist(), out_s.tolist(), out_f.tolist(), strict=True)
    make = Placement._make  # from each row as it is (same field order), length checked
    into.update(zip(tids, [make(r) for r in rows], strict=True))


def heft_direct(
    graph: TaskGraph, cluster: Cluster, cost: CostModel, now: float, insertion: bool
) -> Plan | None:
    """HEFT for a request with nothing fixed or booked and every task able to run everywhere,
    upward ranks and keys compiled too: the plan `heft` makes through `Prepared` and
    `ListScheduler` (same ranks, keys and loop), without their set-up, which on a 10-task
    request took most of the time. None when the request needs the general path: numba off,
    a model without a batch interface, busy windows, a cluster too large for dense
    matrices, a task some device is ruled out for, or a compute time that is not a finite
    number >= 0 (the general path rules such pairs out, explains an `Unschedulable`, or
    raises).
    """
    kernel = _get()
    n, m = len(graph), len(cluster)
    if kernel is None or n == 0 or m == 0 or cluster.any_busy or not fits(n, cluster.n_slots):
        return None
    if not is_batch(cost):
        return None
    for group in graph.constraint_groups:  # (usually one: unconstrained tasks)
        if not eligible_everywhere(graph.tasks[int(group[0])], cluster):
            return None  # some task may not run somewhere: the general path rules it out
    w = np.asarray(cost.compute_matrix(graph.tasks, cluster), dtype=np.float64)
    if w.shape != (n, m) or not w.flags.c_contiguous:
        return None
    table = cost.transfer_table(cluster)
    dense = table.dense()
    if dense is None:
        return None
    lat_mean, inv_mean = table.affine()
    arrays = graph.arrays
    lat, bw = dense
    out = _module.heft_direct(
        w, np.add.reduce(w, axis=1), arrays.topo_pos, arrays.src, arrays.dst, arrays.nbytes,
        float(lat_mean), float(inv_mean), np.ascontiguousarray(lat), np.ascontiguousarray(bw),
        float(now), bool(insertion), cluster.slot_base, cluster.slot_counts,
    )  # fmt: skip
    if len(out[0]) != n:  # a negative, infinite or NaN compute time somewhere
        return None
    placements: dict[str, Placement] = {}
    _collect(graph, cluster, out, placements)
    return Plan(placements=placements, algorithm="heft" if insertion else "heft-noins")


Timelines = tuple[
    NDArray[np.float64], NDArray[np.float64], NDArray[np.int64], NDArray[np.float64],
    NDArray[np.float64],
]  # fmt: skip


_NONE_BOOKED: Timelines = (
    np.empty((0, 0)), np.empty((0, 0)), np.empty(0, dtype=np.int64), np.empty(0), np.empty(0),
)  # fmt: skip


def _timelines(slots: ClusterSlots, cluster: Cluster, now: float, n: int) -> Timelines:
    """Every slot's busy intervals as rows of (starts, finishes), room for n more each;
    empty rows where no slot has any (the kernel then makes them, cheaper than numpy here)."""
    built = slots.built()
    if not built:
        return _NONE_BOOKED
    longest = max((len(tl.starts) for _, lines in built for tl in lines), default=1)
    n_slots = cluster.n_slots
    cap = longest + n
    st = np.empty((n_slots, cap))
    fi = np.empty((n_slots, cap))
    st[:, 0] = -math.inf
    fi[:, 0] = now
    cnt = np.ones(n_slots, dtype=np.int64)
    hor = np.full(n_slots, -math.inf)
    head = np.full(n_slots, now)
    first = cluster.slot_base
    for d, lines in built:
        for k, tl in enumerate(lines):
            s, c = int(first[d]) + k, len(tl.starts)
            st[s, :c] = tl.starts
            fi[s, :c] = tl.finishes
            cnt[s], hor[s], head[s] = c, tl.horizon, tl.head
    return st, fi, cnt, hor, head


_warm = False


def warm_up() -> bool:
    """Compile (or load from the disk cache) now, once per process; True if the compiled
    loop is in use. Loading takes ~1.5 s, compiling ~10 s: time-budgeted callers (the
    portfolio) call this before starting their clock.

    It plans a two-task HEFT request through `heft_direct`, the path `heft.heft` takes for
    it (nothing fixed, a batch cost model, every task eligible everywhere), without
    importing `heft`, which imports this module.
    """
    global _warm
    if runner() is None:
        return False
    if _warm:
        return True
    _warm = True
    from orchestrator.scheduling.cost import MatrixCostModel
    from orchestrator.scheduling.model import Device, Task

    graph = TaskGraph([Task("a"), Task("b")], {("a", "b"): 1.0})
    cluster = Cluster([Device("x", "a", "s"), Device("y", "a", "s")])
    cost = MatrixCostModel({"a": {"x": 1.0, "y": 2.0}, "b": {"x": 1.0, "y": 1.0}})
    heft_direct(graph, cluster, cost, 0.0, True)
    return True
