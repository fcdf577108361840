"""Candidate pre-filtering: plan on the few devices worth considering, not all 10,000.

A list scheduler's cost grows with the device count, yet on a big cluster a good plan uses a
handful of devices: the fastest ones each task class may run on. So before planning, keep
about `k` devices:

1. every device a fixed placement sits on (the plan must keep those);
2. per constraint class (tasks with the same kinds/tiers/memory/labels/pin, which are eligible
   on the same devices) the devices ranked by: most of the class's tasks usable, then least
   total compute time for the class plus the wait until the device is first free at `now`,
   then device index. Every class keeps its best device even past `k` (so pinned targets
   stay), and the rest of `k` is shared out by how much of each class the devices kept so
   far could run at once: a class goes deeper into its ranking while the slots of its kept
   devices are fewer (relative to its task count) than other classes' (90 tasks want more
   devices than 3; 24 tasks want 24 one-slot accelerators but only 3 eight-slot servers);
   but first, for a graph of one class that moves data (batch cost models, k >= 2 x
   SITE_DEVICES), its devices by site (`_best_sites`): sites in order of their best device,
   each keeping its devices among the class's top k plus at least its best SITE_DEVICES, so
   a comm-heavy plan finds site-mates for the tasks that follow the first ones onto a fast
   device, instead of the fastest devices scattered one per site (which made plans
   5.5-21% longer). Graphs of several classes keep the ranking alone (by site, the biggest class
   crowded out the others: +135% on video analytics);
3. for any task still without a usable kept device (a cost model may refuse single tasks),
   its best device.

Kept devices stay in the cluster's order, so index tie-breaks mean the same as unfiltered.
Deterministic; costs about one compute-time matrix of the full cluster (numpy for batch cost
models; one call per device per class for per-pair models, using the class's heaviest task).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.constraints import eligibility_matrix
from orchestrator.scheduling.cost import CostModel, is_batch
from orchestrator.scheduling.model import Cluster, TaskGraph, constraint_signature
from orchestrator.scheduling.plan import Placement
from orchestrator.scheduling.timeline import SlotTimeline
from orchestrator.scheduling.transfer import TransferTable

SITE_DEVICES = 8  # per site, when picking by site (a graph that moves data, k >= 2 sites)
ANCHORS = 8  # a ranked class's likely devices, as sources of its consumers' inputs


def _wait(cluster: Cluster, now: float) -> NDArray[np.float64]:
    """Per device: how long after `now` its busy windows first let it start."""
    out = np.zeros(len(cluster), dtype=np.float64)
    for d, busy in [(d, dev.busy) for d, dev in enumerate(cluster.devices) if dev.busy]:
        out[d] = SlotTimeline(now, busy).head - now
    return out


def _classes(graph: TaskGraph, todo: set[int]) -> list[list[int]]:
    """Tasks grouped by constraint signature, in topological order of their first task (so
    a class's inputs mostly come from classes already ranked)."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for i in graph.topo:
        if i in todo:
            groups.setdefault(constraint_signature(graph.tasks[i]), []).append(i)
    return list(groups.values())


Source = tuple[tuple[int, ...], int]  # a producer's likely devices, and its class (-1: fixed)


def _input_penalty(
    graph: TaskGraph,
    rows: list[int],
    source_of: Mapping[int, Source],
    hosts: list[NDArray[np.bool_]],
    table: TransferTable,
    m: int,
) -> NDArray[np.float64]:
    """Per device: the transfer time of the class's inputs if each came from the nearest of
    its producer's likely devices (`source_of`; producers not ranked yet count 0), or 0 on a
    device that could run the producer itself (`hosts[class]`: then the two may share it)."""
    groups: dict[Source, list[float]] = {}
    for i in rows:
        for p, nbytes in graph.preds[i]:
            found = source_of.get(p)
            if found is not None and nbytes > 0:
                groups.setdefault(found, []).append(nbytes)
    out = np.zeros(m, dtype=np.float64)
    for (src, cls), sizes in groups.items():
        mean_bytes = sum(sizes) / len(sizes)
        near = table.row(mean_bytes, src[0])
        for a in src[1:]:
            np.minimum(near, table.row(mean_bytes, a), out=near)
        if cls >= 0:
            near[hosts[cls]] = 0.0
        out += len(sizes) * near
    return out


def _class_scores(
    graph: TaskGraph, cluster: Cluster, cost: CostModel, rows: list[int], mask: NDArray[np.bool_]
) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64] | None]:
    """Per device for one class: usable task count, total compute time (inf if none usable),
    and for batch models the class's compute times (rows x devices, inf where unusable; empty
    when every task may run on every device of the class, so there is no gap to fill)."""
    m = len(cluster)
    if is_batch(cost):
        w = np.asarray(cost.compute_matrix([graph.tasks[i] for i in rows], cluster), np.float64)
        fast = w[:, mask].sum(axis=0)
        if np.isfinite(fast).all():  # the usual: every task runs on every class device
            count = np.zeros(m, dtype=np.int64)
            count[mask] = len(rows)
            total = np.full(m, math.inf, dtype=np.float64)
            total[mask] = fast
            return count, total, w[:0]
        w = np.where(np.isfinite(w) & mask[None, :], w, math.inf)
        ok = np.isfinite(w)
        count = ok.sum(axis=0).astype(np.int64)
        total = np.where(count > 0, np.where(ok, w, 0.0).sum(axis=0), math.inf)
        if (count[mask] == len(rows)).all():
            w = w[:0]
        return count, total, w
    heavy = max(rows, key=lambda i: graph.tasks[i].work)  # max() keeps the first of equals
    task = graph.tasks[heavy]
    total = np.full(m, math.inf, dtype=np.float64)
    for d in np.flatnonzero(mask).tolist():
        t = cost.compute_time(task, cluster.devices[d])
        if math.isfinite(t):
            total[d] = t
    return np.isfinite(total).astype(np.int64), total, None


def _fill_gaps(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    rows: list[int],
    w: NDArray[np.float64] | None,
    mask: NDArray[np.bool_],
    kept: dict[int, None],
) -> None:
    """Add, for each task of a class with no usable kept device, its fastest usable one."""
    if w is not None and not len(w):
        return
    devices = cluster.devices
    for r, i in enumerate(rows):
        idx = np.fromiter(kept, np.intp, len(kept))
        if w is not None:
            row = w[r]
            if np.isfinite(row).any() and not np.isfinite(row[idx]).any():
                kept.setdefault(int(row.argmin()), None)
            continue
        task = graph.tasks[i]
        here = idx[mask[idx]].tolist()
        if any(math.isfinite(cost.compute_time(task, devices[d])) for d in here):
            continue
        every = np.flatnonzero(mask).tolist()
        finite = [(t, d) for d in every if math.isfinite(t := cost.compute_time(task, devices[d]))]
        if finite:
            kept.setdefault(min(finite)[1], None)


def _best_sites(
    cluster: Cluster, tasks: int, cand: NDArray[np.intp], score: NDArray[np.float64], budget: int
) -> list[int]:
    """Up to `budget` devices, a group per site. Per site: its candidates among the best
    `budget` by `score` cluster-wide, and at least its best `SITE_DEVICES` (fewer where their
    slots already run all `tasks` at once). Sites in order of their best device (where a
    list scheduler puts the first tasks; their consumers then stay on that site's LAN), then
    of summed throughput (slots / score), then code. The cluster's fastest devices, each
    alone on its site, would leave a comm-heavy plan only WAN hops between them; a site that
    holds most of the fastest devices (a data centre) still keeps all of them."""
    site = cluster.site_codes[cand]
    slots = cluster.slot_counts[cand]
    order = np.lexsort((cand, score, site))
    site_o, slots_o = site[order], slots[order]
    first = np.r_[True, site_o[1:] != site_o[:-1]]
    starts = np.flatnonzero(first)
    group = np.cumsum(first) - 1
    ahead = np.cumsum(slots_o) - slots_o
    before = ahead - ahead[starts][group]  # slots of better devices on the same site
    rank = np.arange(len(order)) - starts[group]
    best = np.lexsort((cand, score))[:budget]  # the best `budget` cluster-wide...
    top = np.bincount(site[best], minlength=len(cluster.sites))[site_o[starts]]  # ...per site
    keep = (rank < top[group]) | ((before < tasks) & (rank < SITE_DEVICES))
    value = np.zeros(len(starts), dtype=np.float64)
    np.add.at(value, group, np.where(keep, slots_o / np.maximum(score[order], 1e-300), 0.0))
    ends = np.r_[starts[1:], len(order)]
    out: list[int] = []
    for g in np.lexsort((site_o[starts], -value, score[order[starts]])).tolist():
        if len(out) >= budget:
            break
        lo, hi = int(starts[g]), int(ends[g])
        out.extend(cand[order[lo:hi][keep[lo:hi]]][: budget - len(out)].tolist())
    return out


def prefilter_indices(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    k: int,
    *,
    fixed: Mapping[str, Placement] | None = None,
    now: float = 0.0,
) -> NDArray[np.intp]:
    """Sorted indices of the devices `prefilter_cluster` keeps (see the module doc)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    m = len(cluster)
    fixed = fixed or {}
    if m <= k:
        return np.arange(m, dtype=np.intp)
    kept: dict[int, None] = {cluster.index[p.device_id]: None for p in fixed.values()}
    # Where each task's output probably comes from: fixed ones' devices, then each ranked
    # class's top devices (batch models only: others have no cheap transfer rows).
    source_of: dict[int, Source] = {
        graph.index[t]: ((cluster.index[p.device_id],), -1) for t, p in fixed.items()
    }
    hosts: list[NDArray[np.bool_]] = []
    table = cost.transfer_table(cluster) if is_batch(cost) else None
    eligible = eligibility_matrix(graph, cluster)
    wait = _wait(cluster, now)
    ranked: list[tuple[float, int, int, int]] = []  # (slots share, class, depth, device)
    biggest: tuple[int, NDArray[np.intp], NDArray[np.float64]] | None = None  # rows, cand, score
    classes = _classes(graph, set(range(len(graph))) - set(source_of))
    times: list[NDArray[np.float64] | None] = []
    for c, rows in enumerate(classes):
        count, total, w = _class_scores(graph, cluster, cost, rows, eligible[rows[0]])
        times.append(w)
        hosts.append(count > 0)
        cand = np.flatnonzero(hosts[c])
        if not cand.size:
            continue
        score = total[cand] + wait[cand]
        if table is not None:
            score += _input_penalty(graph, rows, source_of, hosts, table, m)[cand]
        if biggest is None or len(rows) > biggest[0]:
            biggest = (len(rows), cand, score)
        order = np.lexsort((cand, score, -count[cand]))[:k]
        best = cand[order].tolist()
        for i in rows:
            source_of[i] = (tuple(best[:ANCHORS]), c)
        kept.setdefault(best[0], None)
        size = float(len(rows))
        before = 0  # slots of the class's better devices: how much of it they can run at once
        for depth, d in enumerate(best):
            ranked.append((before / size, c, depth, d))
            before += cluster.slots[d]
    by_site = table is not None and len(classes) == 1 and bool(graph.edges)
    if by_site and biggest is not None and k >= 2 * SITE_DEVICES:
        for d in _best_sites(cluster, biggest[0], biggest[1], biggest[2], k):
            if len(kept) >= k:
                break
            kept.setdefault(d, None)
    ranked.sort()
    for _, _, _, d in ranked:
        if len(kept) >= k:
            break
        kept.setdefault(d, None)
    for rows, w in zip(classes, times, strict=True):  # a cost model may refuse single tasks
        _fill_gaps(graph, cluster, cost, rows, w, eligible[rows[0]], kept)
    return np.sort(np.fromiter(kept, np.intp, len(kept)))


def prefilter_cluster(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    k: int,
    *,
    fixed: Mapping[str, Placement] | None = None,
    now: float = 0.0,
) -> Cluster:
    """At most about `k` devices of `cluster` (plus those fixed placements and every task's
    schedulability need), chosen as in the module doc; `cluster` itself if it is that small."""
    idx = prefilter_indices(graph, cluster, cost, k, fixed=fixed, now=now)
    if len(idx) == len(cluster):
        return cluster
    return Cluster([cluster.devices[d] for d in idx.tolist()])
