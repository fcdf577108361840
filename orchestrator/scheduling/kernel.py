"""The compiled earliest-finish loop (numba); imported only where numba is installed.

Kept apart from `compiled` so numba's on-disk cache can key the functions by module and name
(it cannot cache functions built inside another function). Argument shapes are documented in
`compiled.run_compiled`, which is the only caller.
"""

# mypy: ignore-errors
# numba compiles these from the bytecode; their argument types are numba's, not Python's

import math

import numpy as np
from numba import njit

njit = njit(cache=True, nogil=True)


@njit
def earliest_start(st, fi, cnt, hor, s, ready, duration, limit):
    if duration <= 0.0:
        return ready
    n = cnt[s]
    if ready >= hor[s]:
        last = fi[s, n - 1]
        return ready if ready >= last else last
    k = np.searchsorted(fi[s, :n], ready, side="right")  # bisect_right
    v = ready
    while k < n:
        if v + duration <= st[s, k]:
            return v
        v = fi[s, k]
        if v + duration > limit:
            return v
        k += 1
    return v


@njit
def best_slot(st, fi, cnt, hor, base, nsl, d, ready, duration, insertion, limit):
    if duration <= 0.0:
        return 0, ready
    best_k, best_start = 0, math.inf
    for k in range(nsl[d]):
        s = base[d] + k
        if (not insertion) or ready >= hor[s]:
            v = fi[s, cnt[s] - 1]
            if v < ready:
                v = ready
        else:
            v = earliest_start(st, fi, cnt, hor, s, ready, duration, limit)
        if v < best_start:
            best_k, best_start = k, v
            if v + duration < limit:
                limit = v + duration
    return best_k, best_start


@njit
def book(st, fi, cnt, hor, head, s, start, finish):
    if finish <= start:
        return
    n = cnt[s]
    k = np.searchsorted(fi[s, :n], start, side="right")  # bisect_right
    for j in range(n, k, -1):
        st[s, j] = st[s, j - 1]
        fi[s, j] = fi[s, j - 1]
    st[s, k] = start
    fi[s, k] = finish
    cnt[s] = n + 1
    if start <= head[s]:
        j, h = k, finish
        while j + 1 <= n and st[s, j + 1] <= h:
            j += 1
            if fi[s, j] > h:
                h = fi[s, j]
        head[s] = h
    if k == n:
        if start > fi[s, k - 1]:
            hor[s] = start
        return
    if st[s, k + 1] != hor[s] or fi[s, k] < st[s, k + 1]:
        return
    if start > fi[s, k - 1]:
        hor[s] = start
        return
    j = k - 1
    while j >= 1 and st[s, j] <= fi[s, j - 1]:
        j -= 1
    hor[s] = st[s, j] if j >= 1 else -math.inf


@njit
def heap_less(hk, hp, a, b):
    return hk[a] < hk[b] or (hk[a] == hk[b] and hp[a] < hp[b])


@njit
def heap_push(heap, size, i, hk, hp):
    """Push task i on the ready heap of `size` entries; returns the new size."""
    heap[size] = i
    c = size
    while c > 0:
        par = (c - 1) // 2
        if heap_less(hk, hp, heap[c], heap[par]):
            heap[c], heap[par] = heap[par], heap[c]
            c = par
        else:
            break
    return size + 1


@njit
def summarise(fi, cnt, hor, head, base, nsl, d, tail, dhor, free):
    """Device d's slot summaries: earliest tail, latest horizon, earliest head."""
    s0 = base[d]
    tail[d] = fi[s0, cnt[s0] - 1]
    dhor[d] = hor[s0]
    free[d] = head[s0]
    for k in range(1, nsl[d]):
        s = s0 + k
        last = fi[s, cnt[s] - 1]
        if last < tail[d]:
            tail[d] = last
        if hor[s] > dhor[d]:
            dhor[d] = hor[s]
        if head[s] < free[d]:
            free[d] = head[s]


@njit
def by_source(n, e_src, e_dst, e_b):
    """Edge lists per source task (CSR, in edge order within a task): pointers, the other
    ends, bytes. With the ends swapped: predecessor lists."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    for e in range(e_src.shape[0]):
        ptr[e_src[e] + 1] += 1
    for i in range(n):
        ptr[i + 1] += ptr[i]
    idx = np.empty(e_src.shape[0], dtype=np.int64)
    nb = np.empty(e_src.shape[0])
    fill = ptr[:-1].copy()
    for e in range(e_src.shape[0]):
        a = e_src[e]
        idx[fill[a]] = e_dst[e]
        nb[fill[a]] = e_b[e]
        fill[a] += 1
    return ptr, idx, nb


@njit
def upward_keys(w, total, topo_pos, e_src, e_dst, e_b, lat_mean, inv_mean):
    """`ranks.upward_rank_array` then `ranks.priority_keys`, the same operations in the same
    order (the max over successors does not depend on their order), for a compute matrix
    `w` whose every entry is usable; `total` is numpy's sum of each row of `w` (the mean
    is `ranks.mean_compute`'s total / devices). No keys (an empty array) where some entry
    is negative, inf or NaN: that request takes the general path."""
    n, m = w.shape
    for i in range(n):
        if not math.isfinite(total[i]):
            return np.zeros(0, dtype=np.int64)
        for c in range(m):
            if not w[i, c] >= 0.0:
                return np.zeros(0, dtype=np.int64)
    wbar = np.empty(n)
    for i in range(n):
        wbar[i] = total[i] / m
    ptr, idx, nb = by_source(n, e_src, e_dst, e_b)
    topo = np.empty(n, dtype=np.int64)
    for i in range(n):
        topo[topo_pos[i]] = i
    rank = np.empty(n)
    for t in range(n - 1, -1, -1):
        i = topo[t]
        best = 0.0
        for q in range(ptr[i], ptr[i + 1]):
            r = (lat_mean + nb[q] * inv_mean) + rank[idx[q]]
            if r > best:
                best = r
        rank[i] = wbar[i] + best
    keys = np.zeros(n, dtype=np.int64)
    scale = 0.0
    for i in range(n):
        if math.isfinite(rank[i]) and abs(rank[i]) > scale:
            scale = abs(rank[i])
    quantum = scale * 2.0**-30
    if quantum == 0.0:  # as `ranks.priority_keys`: all tie
        return keys
    for i in range(n):
        r = rank[i] if math.isfinite(rank[i]) else scale * 2.0
        keys[i] = int(-np.rint(r / quantum))
    return keys


@njit
def kernel(
    keys, topo_pos, e_src, e_dst, e_b, is_fixed, w, lat, bw, now, insertion, base, nsl,
    st, fi, cnt, hor, head, finish, where, n_todo,
):  # fmt: skip
    n, m = w.shape
    n_e = e_src.shape[0]
    if is_fixed.shape[0] == 0:  # nothing fixed: no finish times or devices to start from
        is_fixed = np.zeros(n, dtype=np.bool_)
        finish = np.zeros(n)
        where = np.zeros(n, dtype=np.int64)
    if st.shape[0] == 0:  # nothing booked before: every slot free from `now`
        n_slots = 0
        for d in range(m):
            n_slots += nsl[d]
        st = np.empty((n_slots, n + 1))
        fi = np.empty((n_slots, n + 1))
        st[:, 0] = -math.inf
        fi[:, 0] = now
        cnt = np.ones(n_slots, dtype=np.int64)
        hor = np.full(n_slots, -math.inf)
        head = np.full(n_slots, now)
    # the placements in the order they were made: task, slot, start, finish, device
    order = np.zeros(n_todo, dtype=np.int64)
    out_k = np.zeros(n_todo, dtype=np.int64)
    out_s = np.zeros(n_todo)
    out_f = np.zeros(n_todo)
    out_d = np.zeros(n_todo, dtype=np.int64)
    # predecessor and successor lists (CSR); their order does not matter: arrival times are
    # combined by max, and the heap order is total
    pred_ptr, pred_idx, pred_b = by_source(n, e_dst, e_src, e_b)
    succ_ptr, succ_idx, _ = by_source(n, e_src, e_dst, e_b)
    waiting = np.zeros(n, dtype=np.int64)
    for e in range(n_e):
        if not is_fixed[e_src[e]]:
            waiting[e_dst[e]] += 1
    # the ready heap holds task indices, ordered by (key, topological position)
    hk = keys
    hp = topo_pos
    heap = np.empty(n, dtype=np.int64)
    size = 0
    for i in range(n):
        if waiting[i] == 0 and not is_fixed[i]:
            size = heap_push(heap, size, i, hk, hp)
    tail = np.empty(m)
    dhor = np.empty(m)
    free = np.empty(m)
    for d in range(m):
        summarise(fi, cnt, hor, head, base, nsl, d, tail, dhor, free)
    drt = np.empty(m)
    score = np.empty(m)
    cand_low = np.empty(m)
    cand_dev = np.empty(m, dtype=np.int64)
    placed = 0
    while size > 0:
        i = heap[0]
        size -= 1
        heap[0] = heap[size]
        c = 0
        while True:
            lft = 2 * c + 1
            if lft >= size:
                break
            small = lft
            if lft + 1 < size and heap_less(hk, hp, heap[lft + 1], heap[lft]):
                small = lft + 1
            if heap_less(hk, hp, heap[small], heap[c]):
                heap[c], heap[small] = heap[small], heap[c]
                c = small
            else:
                break
        # data-ready time on every device
        p0, p1 = pred_ptr[i], pred_ptr[i + 1]
        if p0 == p1:
            for c in range(m):
                drt[c] = now
        else:
            low = math.inf
            for q in range(p0, p1):
                p = pred_idx[q]
                nb = pred_b[q]
                src = where[p]
                fin = finish[p]
                if fin < low:
                    low = fin
                for c in range(m):
                    r = (nb / bw[src, c] + lat[src, c]) + fin
                    if q == p0 or r > drt[c]:
                        drt[c] = r
            if low < now:
                for c in range(m):
                    if drt[c] < now:
                        drt[c] = now
        best = math.inf
        d = 0
        for c in range(m):
            r = drt[c]
            wc = w[i, c]
            if wc == 0.0:
                v = r
            else:
                t = tail[c]
                v = (r if r >= t else t) + wc
            score[c] = v
            if v < best:
                best, d = v, c
        found = False
        ck, cs = 0, 0.0
        if insertion:
            nc = 0
            for c in range(m):
                r = drt[c]
                if r < dhor[c]:
                    f = free[c]
                    lw = (r if r >= f else f) + w[i, c]
                    if lw <= best:
                        # insertion sort by (bound, index)
                        j = nc
                        while j > 0 and cand_low[j - 1] > lw:
                            cand_low[j] = cand_low[j - 1]
                            cand_dev[j] = cand_dev[j - 1]
                            j -= 1
                        cand_low[j] = lw
                        cand_dev[j] = c
                        nc += 1
            for j in range(nc):
                if cand_low[j] > best:
                    break
                c = cand_dev[j]
                dur = w[i, c]
                k, s = best_slot(st, fi, cnt, hor, base, nsl, c, drt[c], dur, True, best)
                sc = s + dur
                if sc < best or (sc == best and c < d):
                    best, d, ck, cs, found = sc, c, k, s, True
                elif c == d:
                    ck, cs, found = k, s, True
        if not found:
            ck, cs = best_slot(st, fi, cnt, hor, base, nsl, d, drt[d], w[i, d], insertion, math.inf)
        end = cs + w[i, d]
        sl = base[d] + ck
        book(st, fi, cnt, hor, head, sl, cs, end)
        summarise(fi, cnt, hor, head, base, nsl, d, tail, dhor, free)
        finish[i] = end
        where[i] = d
        order[placed] = i
        out_k[placed] = ck
        out_s[placed] = cs
        out_f[placed] = end
        out_d[placed] = d
        placed += 1
        for q in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[q]
            waiting[j] -= 1
            if waiting[j] == 0:
                size = heap_push(heap, size, j, hk, hp)
    return order, out_k, out_s, out_f, out_d


@njit
def heft_direct(w, total, topo_pos, e_src, e_dst, e_b, lat_mean, inv_mean, lat, bw, now,
                insertion, base, nsl):  # fmt: skip
    """`upward_keys` then `kernel` with nothing fixed or booked, in one call from Python (each
    call from Python costs microseconds of argument checks). Empty outputs where
    `upward_keys` gives no keys."""
    n = w.shape[0]
    keys = upward_keys(w, total, topo_pos, e_src, e_dst, e_b, lat_mean, inv_mean)
    if keys.shape[0] != n:
        none = np.zeros(0, dtype=np.int64)
        return none, none, np.zeros(0), np.zeros(0), none
    return kernel(
        keys, topo_pos, e_src, e_dst, e_b, np.zeros(0, dtype=np.bool_), w, lat, bw, now,
        insertion, base, nsl, np.empty((0, 0)), np.empty((0, 0)), np.zeros(0, dtype=np.int64),
        np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64), n,
    )  # fmt: skip
