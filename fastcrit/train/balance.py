"""Balancing work: Karmarkar-Karp partitions and token-budget micro-batches.

The cost of a sequence in a transformer step grows as ``a * L + L**2`` (the linear layers and the
attention; verl weighs it 24576 L + L^2, ANCHORS). ``karmarkar_karp`` splits sequences into ``k``
parts of near-equal total cost with the largest differencing method (Karmarkar and Karp, 1982;
k-way form by Michiels et al.): every item starts as a k-tuple of parts holding it alone, and the
two tuples whose largest and smallest parts differ most are merged, largest part with smallest,
until one tuple is left. Compiled with numba when it is installed (the pure-Python path gives the
same partition, slower).

``token_micro_batches`` cuts rows into micro-batches whose padded size (rows x longest row) stays
within a token budget, longest rows first, so that rows of like length share a micro-batch and
padding is small.
"""

from __future__ import annotations

import math

import numpy as np

try:
    import numba
except ImportError:  # the pure-Python path below is the same algorithm
    numba = None

ATTN_COEF = 24576  # a in a * L + L^2


def workload(lengths) -> np.ndarray:
    """Estimated cost of one forward/backward per sequence of each length: 24576 L + L^2."""
    L = np.asarray(lengths, dtype=np.float64)
    return ATTN_COEF * L + L * L


def _push(heap: np.ndarray, key: np.ndarray, size: int, s: int) -> int:
    """Push state ``s`` on the binary max-heap ``heap[:size]`` ordered by (key, -id); new size."""
    heap[size] = s
    j = size
    while j > 0:
        p = (j - 1) // 2
        a, b = heap[p], heap[j]
        if key[a] > key[b] or (key[a] == key[b] and a < b):
            break
        heap[p], heap[j] = b, a
        j = p
    return size + 1


if numba is not None:  # compiled before _kk, which calls it
    _push = numba.njit(cache=True)(_push)


def _kk(weights: np.ndarray, k: int) -> np.ndarray:
    """Part index of every item (int64 [n]). See the module docstring."""
    n = weights.shape[0]
    sums = np.zeros((n, k), dtype=np.float64)  # state s: its k parts' sums, sorted descending
    head = np.full((n, k), -1, dtype=np.int64)  # linked lists of the items in each part
    tail = np.full((n, k), -1, dtype=np.int64)
    nxt = np.full(n, -1, dtype=np.int64)
    # max-heap on (spread, -state) as a binary heap of state ids
    heap = np.zeros(n, dtype=np.int64)
    key = np.zeros(n, dtype=np.float64)
    size = 0
    for i in range(n):
        sums[i, 0] = weights[i]
        head[i, 0] = i
        tail[i, 0] = i
        key[i] = weights[i]
        size = _push(heap, key, size, i)
    new_sums = np.zeros(k, dtype=np.float64)
    new_head = np.zeros(k, dtype=np.int64)
    new_tail = np.zeros(k, dtype=np.int64)
    while size > 1:
        pops = np.zeros(2, dtype=np.int64)
        for t in range(2):  # pop the two largest spreads
            pops[t] = heap[0]
            size -= 1
            heap[0] = heap[size]
            j = 0
            while True:
                left, right, best = 2 * j + 1, 2 * j + 2, j
                if left < size:
                    a, b = heap[left], heap[best]
                    if key[a] > key[b] or (key[a] == key[b] and a < b):
                        best = left
                if right < size:
                    a, b = heap[right], heap[best]
                    if key[a] > key[b] or (key[a] == key[b] and a < b):
                        best = right
                if best == j:
                    break
                heap[j], heap[best] = heap[best], heap[j]
                j = best
        s, o = pops[0], pops[1]
        for j in range(k):  # s's largest part with o's smallest, and so on
            q = k - 1 - j
            new_sums[j] = sums[s, j] + sums[o, q]
            h1, t1, h2, t2 = head[s, j], tail[s, j], head[o, q], tail[o, q]
            if h1 == -1:
                new_head[j], new_tail[j] = h2, t2
            elif h2 == -1:
                new_head[j], new_tail[j] = h1, t1
            else:
                nxt[t1] = h2
                new_head[j], new_tail[j] = h1, t2
        order = np.argsort(-new_sums, kind="mergesort")
        for j in range(k):
            sums[s, j] = new_sums[order[j]]
            head[s, j] = new_head[order[j]]
            tail[s, j] = new_tail[order[j]]
        key[s] = sums[s, 0] - sums[s, k - 1]
        size = _push(heap, key, size, s)  # s back in
    part = np.full(n, -1, dtype=np.int64)
    if n:
        s = heap[0]
        for j in range(k):
            i = head[s, j]
            while i != -1:
                part[i] = j
                i = nxt[i]
    return part


_kk_fast = numba.njit(cache=True)(_kk) if numba is not None else _kk


def karmarkar_karp(weights, k: int) -> list[list[int]]:
    """``k`` lists of item indices (each ascending) whose summed ``weights`` are near equal; parts
    are ordered by decreasing sum (some may be empty when there are fewer than k items)."""
    if k < 1:
        raise ValueError(f"karmarkar_karp: k must be >= 1, got {k}")
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or (w.size and (not np.isfinite(w).all() or (w < 0).any())):
        raise ValueError("karmarkar_karp: weights must be a 1-D list of finite numbers >= 0")
    part = _kk_fast(w, k)
    return [sorted(np.nonzero(part == j)[0].tolist()) for j in range(k)]


def imbalance(loads) -> float:
    """max / mean of per-part loads (1.0 = perfectly even; 1.0 when all are 0)."""
    loads = [float(x) for x in loads]
    mean = sum(loads) / len(loads) if loads else 0.0
    return max(loads) / mean if mean > 0 else 1.0


def token_micro_batches(lengths, budget: int, groups=None, packed: bool = False) -> list[list[int]]:
    """Micro-batches (lists of row indices) whose padded size, rows x longest row, is at most
    ``budget`` tokens, filled longest rows first; a row (or group) longer than the budget alone
    gets a micro-batch of its own. With ``groups`` (a group id per row), a group's rows stay in
    one micro-batch. ``packed``: the rows run end to end without padding, so a micro-batch costs
    the sum of its lengths; first-fit decreasing."""
    if budget < 1:
        raise ValueError(f"token_micro_batches: budget must be >= 1 token, got {budget}")
    lengths = [int(x) for x in lengths]
    units: list[list[int]] = []
    if groups is None:
        units = [[i] for i in range(len(lengths))]
    else:
        by: dict = {}
        for i, g in enumerate(groups):
            by.setdefault(int(g), []).append(i)
        units = list(by.values())
    units.sort(key=lambda u: (-max(lengths[i] for i in u), u[0]))
    if packed:
        bins: list[list[int]] = []
        loads: list[int] = []
        for u in units:
            cost = sum(lengths[i] for i in u)
            j = next((j for j, load in enumerate(loads) if load + cost <= budget), None)
            if j is None:
                bins.append(list(u))
                loads.append(cost)
            else:
                bins[j] += u
                loads[j] += cost
        return [sorted(b) for b in bins]
    out: list[list[int]] = []
    longest = 0
    for u in units:
        ul = max(lengths[i] for i in u)
        if out and (len(out[-1]) + len(u)) * max(longest, ul) <= budget:
            out[-1] += u
            longest = max(longest, ul)
        else:
            out.append(list(u))
            longest = ul
    return [sorted(mb) for mb in out]


def split_to(micro: list[list[int]], count: int, groups=None) -> list[list[int]]:
    """Split the largest micro-batches in two until there are ``count`` of them (every rank must
    run as many forward passes as the others: FSDP gathers weights in each). With ``groups`` (a
    group id per row) a split never divides a group. A micro-batch that cannot split (one row, or
    one group) stays; then an empty one is added, which the caller runs with weight 0."""

    def units(m):
        if groups is None:
            return [[i] for i in m]
        by: dict = {}
        for i in m:
            by.setdefault(int(groups[i]), []).append(i)
        return list(by.values())

    out = [list(m) for m in micro]
    while len(out) < count:
        splittable = [j for j in range(len(out)) if len(units(out[j])) > 1]
        if not splittable:
            out.append([])
            continue
        big = max(splittable, key=lambda j: len(out[j]))
        us = units(out.pop(big))
        half = math.ceil(len(us) / 2)
        out[big:big] = [sorted(i for u in us[:half] for i in u), sorted(i for u in us[half:] for i in u)]
    return out
