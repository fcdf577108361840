"""The fast HEFT must place every task exactly where a naive, obviously-correct HEFT does.

The reference scans every (device, slot) with plain lists and per-pair cost calls; the fast
one uses numpy vectors, transfer tables and a pruned gap search. Same ranks, same tie rules.
"""

from __future__ import annotations

import heapq
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.scheduling import (
    Placement,
    Plan,
    SlotTimeline,
    Unschedulable,
    heft,
    upward_ranks,
)
from orchestrator.scheduling.ranks import priority_keys

from .sched_problems import Problem, problems, random_problem, usable


def _first_fit(busy: list[tuple[float, float]], ready: float, dur: float) -> float:
    """Earliest start >= ready with [start, start+dur) overlapping no busy interval."""
    for s in sorted({ready, *(f for _, f in busy if f >= ready)}):
        if not any(min(s + dur, f) - max(s, b) > 0 for b, f in busy):
            return s
    raise AssertionError("unreachable: the end of the last interval always fits")


def reference_heft(pb: Problem, insertion: bool = True) -> Plan:
    g, c, cost, now = pb.graph, pb.cluster, pb.cost, pb.now
    ranks = upward_ranks(g, c, cost)
    keys = priority_keys(np.asarray([ranks[t] for t in g.ids]))
    topo = {t: k for k, t in enumerate(g.topological_order())}
    busy = {(d.id, k): [(-math.inf, now), *d.busy] for d in c.devices for k in range(d.slots)}
    placed: dict[str, Placement] = {}
    waiting = {t: len(g.predecessors(t)) for t in g.ids}
    heap = [(keys[g.index[t]], topo[t], t) for t in g.ids if waiting[t] == 0]
    heapq.heapify(heap)
    while heap:
        _, _, tid = heapq.heappop(heap)
        task = g.task(tid)
        best: tuple[float, int, int, float] | None = None
        for di, dev in enumerate(c.devices):
            if not usable(task, dev, cost):
                continue
            dur = cost.compute_time(task, dev)
            ready = now
            for p in g.predecessors(tid):
                pp = placed[p]
                arrival = pp.finish + cost.transfer_time(
                    g.edges[(p, tid)], c.device(pp.device_id), dev
                )
                ready = max(ready, arrival)
            for k in range(dev.slots):
                iv = busy[(dev.id, k)]
                end = max(f for b, f in iv if f > b)
                s = _first_fit(iv, ready, dur) if insertion or dur == 0 else max(ready, end)
                cand = (s + dur, di, k, s)
                if best is None or cand[:3] < best[:3]:
                    best = cand
        assert best is not None
        fin, di, k, s = best
        dev = c.devices[di]
        busy[(dev.id, k)].append((s, fin))
        placed[tid] = Placement(tid, dev.id, k, s, fin)
        for j in g.successors(tid):
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(heap, (keys[g.index[j]], topo[j], j))
    return Plan(placed, "reference")


@settings(max_examples=200, deadline=None)
@given(problems(max_tasks=16, max_devices=7), st.booleans())
def test_fast_heft_matches_reference(pb: Problem, insertion: bool) -> None:
    try:
        fast = heft(pb.graph, pb.cluster, pb.cost, now=pb.now, insertion=insertion)
    except Unschedulable:
        return
    ref = reference_heft(pb, insertion)
    assert fast.placements == ref.placements


@pytest.mark.parametrize("seed", range(6))
def test_fast_heft_matches_reference_on_larger_problems(seed: int) -> None:
    rng = random.Random(1000 + seed)
    flavour = ["link", "matrix", "plain"][seed % 3]
    for _ in range(100):  # the first schedulable problem from this seed
        pb = random_problem(rng, 60, 12, flavour, rng.choice([0.0, 2.5]))
        try:
            fast = heft(pb.graph, pb.cluster, pb.cost, now=pb.now)
        except Unschedulable:
            continue
        assert fast.placements == reference_heft(pb).placements
        return
    raise AssertionError("no schedulable problem found")


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_slot_timeline_first_fit_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    now = rng.choice([0.0, 2.0])
    init = [(s, s + rng.uniform(0, 4)) for s in (rng.uniform(0, 20) for _ in range(3))]
    tl = SlotTimeline(now, init)
    busy = [(-math.inf, now), *init]
    for _ in range(12):
        ready = rng.choice([0.0, rng.uniform(0, 30)])
        dur = rng.choice([0.0, rng.uniform(0, 5)])
        want = _first_fit(busy, max(ready, now), dur)
        got = tl.earliest_start(max(ready, now), dur)
        assert got == want
        tl.book(got, got + dur)
        busy.append((got, got + dur))
        free_after = max(f for b, f in busy if f > b)
        assert tl.end == free_after
        # nothing is free before `head`, and the instant `head` itself is free
        head = now
        while any(b <= head < f for b, f in busy if f > b):
            head = next(f for b, f in busy if f > b and b <= head < f)
        assert tl.head == head
        # at or after the horizon, the only room left is after the end
        r = max(tl.horizon, now)
        assert _first_fit(busy, r, rng.uniform(1e-6, 1.0)) == max(r, free_after)
