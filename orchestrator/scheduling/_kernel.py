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
def kernel(
    keys, topo_pos, e_src, e_dst, e_b, is_fixed, w, lat, bw, now, insertion, base, nsl,
    st, fi, cnt, hor, head, finish, where, out_k, out_s, order,
):  # fmt: skip
    n, m = w.shape
    n_e = e_src.shape[0]
    # predecessor and successor lists (CSR) by counting sort of the edges; their order
    # does not matter: arrival times are combined by max, and the heap order is total
    pred_ptr = np.zeros(n + 1, dtype=np.int64)
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    waiting = np.zeros(n, dtype=np.int64)
    for e in range(n_e):
        pred_ptr[e_dst[e] + 1] += 1
        succ_ptr[e_src[e] + 1] += 1
        if not is_fixed[e_src[e]]:
            waiting[e_dst[e]] += 1
    for i in range(n):
        pred_ptr[i + 1] += pred_ptr[i]
        succ_ptr[i + 1] += succ_ptr[i]
    pred_idx = np.empty(n_e, dtype=np.int64)
    pred_b = np.empty(n_e)
    succ_idx = np.empty(n_e, dtype=np.int64)
    pfill = pred_ptr[:-1].copy()
    sfill = succ_ptr[:-1].copy()
    for e in range(n_e):
        a, b = e_src[e], e_dst[e]
        pred_idx[pfill[b]] = a
        pred_b[pfill[b]] = e_b[e]
        pfill[b] += 1
        succ_idx[sfill[a]] = b
        sfill[a] += 1
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
        out_k[i] = ck
        out_s[i] = cs
        order[placed] = i
        placed += 1
        for q in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[q]
            waiting[j] -= 1
            if waiting[j] == 0:
                size = heap_push(heap, size, j, hk, hp)
