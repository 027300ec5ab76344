"""Crossings between neighbouring columns of a layered drawing, the DAG layout's measure.

:func:`crossings` counts them pairwise (vectorised, for tests and benches);
:func:`gap_edges` and :func:`crossing_count` count the same pairs in O(E log E)
(a Fenwick tree per gap), as ``gapEdges`` and ``crossingCount`` in
``static/dag_layout.js`` do, so both layout engines keep the same order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["crossing_count", "crossings", "gap_edges"]


def gap_edges(x: Sequence[float], src: Sequence[int], dst: Sequence[int]
              ) -> list[tuple[int, int, int]]:
    """Edges joining neighbouring columns as ``(gap, left item, right item)``, by gap."""
    rank = {c: i for i, c in enumerate(sorted(set(x)))}
    out = []
    for s, d in zip(src, dst):
        a, b = rank[x[s]], rank[x[d]]
        if abs(a - b) == 1:
            out.append((a, s, d) if a < b else (b, d, s))
    out.sort()
    return out


def _pairs_crossing(ends: list[tuple[float, float]]) -> int:
    """Pairs ``p, q`` with ``lo_p < lo_q`` and ``hi_p > hi_q`` (a Fenwick tree over hi)."""
    ranks = {v: i + 1 for i, v in enumerate(sorted({hi for _, hi in ends}))}
    tree, seen, total, k = [0] * (len(ranks) + 1), 0, 0, 0
    ends = sorted(ends)
    while k < len(ends):
        group = k
        while group < len(ends) and ends[group][0] == ends[k][0]:
            group += 1
        for _, hi in ends[k:group]:  # earlier ends (lower lo) reaching higher
            i, at_most = ranks[hi], 0
            while i > 0:
                at_most, i = at_most + tree[i], i - (i & -i)
            total += seen - at_most
        for _, hi in ends[k:group]:
            i = ranks[hi]
            while i < len(tree):
                tree[i], i = tree[i] + 1, i + (i & -i)
        seen, k = seen + group - k, group
    return total


def crossing_count(gaps: list[tuple[int, int, int]], y: Sequence[float]) -> int:
    """:func:`crossings`' count for the edges of :func:`gap_edges`, in O(E log E)."""
    total, k = 0, 0
    while k < len(gaps):
        end = k
        while end < len(gaps) and gaps[end][0] == gaps[k][0]:
            end += 1
        total += _pairs_crossing([(y[a], y[b]) for _, a, b in gaps[k:end]])
        k = end
    return total


def crossings(x: np.ndarray, y: np.ndarray, src: np.ndarray, dst: np.ndarray) -> int:
    """Number of crossing pairs among edges joining neighbouring columns.

    The usual layered-drawing measure: only edges whose ends sit in adjacent
    distinct x positions count.

    Args:
        x: Item x (the column of each item).
        y: Item y.
        src: Edge sources (item indices).
        dst: Edge targets.

    Returns:
        The crossing count.
    """
    cols, ci = np.unique(x, return_inverse=True)
    a, b = ci[src], ci[dst]
    keep = np.abs(a - b) == 1
    gap = np.minimum(a, b)[keep]
    lo = np.where(a <= b, y[src], y[dst])[keep]
    hi = np.where(a <= b, y[dst], y[src])[keep]
    order = np.lexsort((hi, lo, gap))
    gap, lo, hi = gap[order], lo[order], hi[order]
    total = 0
    for k in range(1, len(gap)):
        same = gap[k:] == gap[:-k]
        if not same.any():
            break
        total += int(np.count_nonzero(same & (lo[k:] > lo[:-k]) & (hi[k:] < hi[:-k])))
    return total
