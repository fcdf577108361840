"""The earliest-finish loop in plain Python floats, for clusters of a few dozen devices.

On 4-32 devices a numpy call costs more than the arithmetic it saves: HEFT on a 50-task DAG
spent most of its time building and reducing 4-element arrays. This loop makes the same
decisions as `ListScheduler.earliest` with the same floating-point operations in the same
order (IEEE doubles either way), so the plans are identical; a property test holds it to that.
Every list here has one entry per device, so the hot loops zip without `strict` (it costs a
third of a 4-device comprehension).
It serves the rule-less run (HEFT and every variant that only changes the priority order).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator.scheduling.plan import Placement, Plan

if TYPE_CHECKING:
    from orchestrator.scheduling.runstate import RunState
    from orchestrator.scheduling.transfer import Lists


def run_small(sched: RunState, keys: Sequence[int], algorithm: str, lists: Lists) -> Plan:
    """`ListScheduler.run` with the default rule, list arithmetic instead of numpy."""
    prep = sched.prep
    graph = prep.graph
    lat_l, bw_l = lists
    wl: list[list[float]] = prep.w.tolist()
    now = prep.now
    m = len(prep.cluster)
    devices = range(m)
    slots = sched.slots
    finish, where, has_zero = sched.finish, sched.where, sched.has_zero
    insertion = sched.insertion
    preds, succs = graph.preds, graph.succs
    is_fixed, topo_pos = prep.is_fixed, prep.topo_pos
    waiting = [0] * len(graph)
    heap: list[tuple[int, int, int]] = []
    any_fixed = bool(prep.fixed_idx)
    for i in prep.todo:
        pi = preds[i]
        waiting[i] = sum(1 for p, _ in pi if not is_fixed[p]) if any_fixed else len(pi)
        if waiting[i] == 0:
            heap.append((keys[i], topo_pos[i], i))
    heapq.heapify(heap)
    base = [now] * m
    # the slot summaries as lists, kept here and written back to `slots` at the end
    tail, horizon, free_at = slots.tail.tolist(), slots.horizon.tolist(), slots.free_at.tolist()
    ids, dev_ids, placements = graph.ids, prep.cluster.ids, sched.placements
    while heap:
        _, _, i = heapq.heappop(heap)
        drt = _ready(preds[i], finish, where, lat_l, bw_l, base, now)
        wi = wl[i]
        score = [(r if r >= t else t) + w for r, t, w in zip(drt, tail, wi)]  # noqa: B905
        if has_zero[i]:
            score = [r if w == 0 else s for r, s, w in zip(drt, score, wi)]  # noqa: B905
        best = min(score)
        d = score.index(best)
        chosen: tuple[int, float] | None = None
        if insertion:
            cand: list[tuple[float, int]] = []
            for c in devices:
                r = drt[c]
                if r < horizon[c]:
                    f = free_at[c]
                    low = (r if r >= f else f) + wi[c]
                    if low <= best:
                        cand.append((low, c))
            if cand:
                cand.sort()  # by bound, then index: what a stable argsort gives
                for bound, c in cand:
                    if bound > best:
                        break
                    dur = wi[c]
                    k, s = slots.best_slot(c, drt[c], dur, True, best)
                    sc = s + dur
                    if sc < best or (sc == best and c < d):
                        best, d, chosen = sc, c, (k, s)
                    elif c == d:
                        chosen = (k, s)
        if chosen is None:
            chosen = slots.best_slot(d, drt[d], wi[d], insertion)
        k, start = chosen
        end = start + wi[d]
        lines = slots.timelines(d)
        lines[k].book(start, end)
        if len(lines) == 1:
            tl = lines[0]
            tail[d], horizon[d], free_at[d] = tl.finishes[-1], tl.horizon, tl.head
        else:
            tail[d] = min(tl.finishes[-1] for tl in lines)
            horizon[d] = max(tl.horizon for tl in lines)
            free_at[d] = min(tl.head for tl in lines)
        finish[i], where[i] = end, d
        tid = ids[i]
        placements[tid] = Placement(tid, dev_ids[d], k, start, end)
        for j, _ in succs[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(heap, (keys[j], topo_pos[j], j))
    slots.tail[:], slots.horizon[:], slots.free_at[:] = tail, horizon, free_at
    return Plan(placements=placements, algorithm=algorithm)


def _ready(
    preds: Sequence[tuple[int, float]],
    finish: list[float],
    where: list[int],
    lat_l: list[list[float]],
    bw_l: list[list[float]],
    base: list[float],
    now: float,
) -> list[float]:
    """Per device: when all inputs can be there (as `engine.ready_times`, in lists)."""
    if not preds:
        return base
    acc: list[float] | None = None
    low = math.inf
    for p, nbytes in preds:
        s, fin = where[p], finish[p]
        if fin < low:
            low = fin
        row = [(nbytes / b + lt) + fin for b, lt in zip(bw_l[s], lat_l[s])]  # noqa: B905
        acc = row if acc is None else [a if a >= r else r for a, r in zip(acc, row)]  # noqa: B905
    assert acc is not None
    if low < now:  # only a fixed predecessor can finish before now
        acc = [a if a >= now else now for a in acc]
    return acc
