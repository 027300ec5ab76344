"""A layered layout of a joint graph where the backward mirrors the forward.

Used by ``plot_dag`` and the static SVG/PNG export. ``dag_view`` does not ship
these positions: its renderer (``static/dagview.js``, ``layeredLayout``) runs the
same steps in the browser over the visible items only (open nodes, closed groups).

The drawing has two bands that share one horizontal axis:

- the forward band (parameters, inputs, forward ops) above, data flowing
  left to right, one column per longest-path layer;
- the backward band below, data flowing right to left, each backward node
  sitting under the forward node it differentiates (its ``fwd_twin``).

How it is computed, all in O(V + E) per step:

1. Longest-path layering of the forward nodes in topological order; sources
   (placeholders) are pulled next to their first consumer.
2. Each backward node gets a *bucket*: the forward layer of its twin, capped
   by the buckets of its backward predecessors so buckets never increase
   along an edge. Inside a bucket a node's depth is its longest backward
   path from the bucket's entry. A forward layer is widened to as many
   columns as its bucket is deep, so the two bands stay aligned.
3. Vertical order inside each column by barycentre sweeps (a fixed number,
   vectorised): forward nodes follow their neighbours, backward nodes their
   neighbours, their twin and the saved activations they read, so the
   backward band is a mirror image of the forward one.
4. Edges are straight segments inside a band and one-bend polylines (bending
   on the axis between the bands) across, packed into flat coordinate arrays
   with NaN gaps for a single WebGL line trace.

Nodes are integers ``0..n-1`` in a topological order; an edge ``u -> v`` with
``u >= v`` (possible only in a collapsed module graph) is drawn but ignored by
the layering.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FORWARD, BACKWARD = 0, 1


@dataclass
class Layout:
    """Positions of nodes and routed edges.

    Attributes:
        x: Horizontal position per node (column units).
        y: Vertical position per node (slot units; forward > 0 > backward).
        layer: Rank along the data flow; every non-back edge goes to a higher rank.
        band: ``FORWARD`` or ``BACKWARD`` per node.
        edge_x: Edge polylines' x coordinates, NaN between edges.
        edge_y: Edge polylines' y coordinates, NaN between edges.
    """

    x: np.ndarray
    y: np.ndarray
    layer: np.ndarray
    band: np.ndarray
    edge_x: np.ndarray
    edge_y: np.ndarray


def _adjacency(n: int, src: np.ndarray, dst: np.ndarray) -> tuple[list[list[int]], list[list[int]]]:
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(src.tolist(), dst.tolist()):
        if s < d:
            preds[d].append(s)
            succs[s].append(d)
    return preds, succs


def forward_layers(is_bwd: list[bool], preds: list[list[int]], succs: list[list[int]]) -> list[int]:
    """Longest-path layers of the forward nodes, sources pulled to their consumers.

    Args:
        is_bwd: Band of each node.
        preds: Forward-order predecessors per node.
        succs: Forward-order successors per node.

    Returns:
        The layer per node (0 for backward nodes, which are placed later).
    """
    n = len(is_bwd)
    layer = [0] * n
    sources = []
    for v in range(n):
        if is_bwd[v]:
            continue
        best = -1
        for u in preds[v]:
            if not is_bwd[u] and layer[u] > best:
                best = layer[u]
        layer[v] = best + 1
        if not preds[v]:
            sources.append(v)
    # nodes fed only by sources (weights, their transposes) move next to their first user
    weight_only = [False] * n
    for v in sources:
        weight_only[v] = True
    for v in range(n):
        if not is_bwd[v] and preds[v] and all(weight_only[u] for u in preds[v]):
            weight_only[v] = True
    for v in range(n - 1, -1, -1):
        if weight_only[v]:
            users = [layer[w] for w in succs[v] if not is_bwd[w]]
            if users:
                layer[v] = max(min(users) - 1, layer[v])
    return layer


def backward_buckets(is_bwd: list[bool], preds: list[list[int]], twin: list[int],
                     flayer: list[int]) -> tuple[list[int], list[int]]:
    """Bucket (mirrored forward layer) and depth inside the bucket of each backward node.

    Args:
        is_bwd: Band of each node.
        preds: Predecessors per node.
        twin: Index of the forward twin per node, -1 if none.
        flayer: Forward layers from :func:`forward_layers`.

    Returns:
        ``(bucket, depth)`` per node (0 for forward nodes).
    """
    n = len(is_bwd)
    top = max((flayer[v] for v in range(n) if not is_bwd[v]), default=0)
    bucket = [0] * n
    depth = [0] * n
    for v in range(n):
        if not is_bwd[v]:
            continue
        t = twin[v]
        k = flayer[t] if t >= 0 and not is_bwd[t] else top + 1
        bpreds = [u for u in preds[v] if is_bwd[u]]
        for u in bpreds:
            if bucket[u] < k:
                k = bucket[u]
        k = min(k, top)
        d = 0
        for u in bpreds:
            if bucket[u] == k and depth[u] + 1 > d:
                d = depth[u] + 1
        bucket[v], depth[v] = k, d
    return bucket, depth


def _centered_slots(col: np.ndarray, key: np.ndarray, tie: np.ndarray) -> np.ndarray:
    """Slot of each node inside its column, sorted by ``key``, centred on 0."""
    order = np.lexsort((tie, key, col))
    scol = col[order]
    n = len(col)
    start = np.r_[0, np.flatnonzero(np.diff(scol)) + 1]
    counts = np.diff(np.r_[start, n])
    run_start = np.repeat(start, counts)
    run_count = np.repeat(counts, counts)
    pos = np.empty(n, dtype=float)
    pos[order] = np.arange(n) - run_start - (run_count - 1) / 2.0
    return pos


def _barycentre(n: int, tgt: np.ndarray, src_pos: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Mean of ``src_pos`` over the edges into each target; ``fallback`` where none."""
    s = np.bincount(tgt, weights=src_pos, minlength=n)
    c = np.bincount(tgt, minlength=n)
    out = fallback.copy()
    has = c > 0
    out[has] = s[has] / c[has]
    return out


def order_columns(col: np.ndarray, band: np.ndarray, src: np.ndarray, dst: np.ndarray,
                  twin: np.ndarray, sweeps: int, x: np.ndarray) -> np.ndarray:
    """Centred vertical slot of every node after ``sweeps`` barycentre sweeps.

    Args:
        col: Column per node (backward columns offset so bands never share one).
        band: Band per node.
        src: Edge sources.
        dst: Edge targets.
        twin: Forward twin per node or -1.
        sweeps: Alternating down/up passes; 0 keeps the topological order.
        x: Drawn x per node, to count crossings; the order with fewest is kept.

    Returns:
        Slot per node, centred on 0 within its column.
    """
    n = len(col)
    idx = np.arange(n, dtype=float)
    pos = _centered_slots(col, idx, idx)
    same = band[src] == band[dst]
    s_in, d_in = src[same], dst[same]
    cross = (band[src] == FORWARD) & (band[dst] == BACKWARD)
    has_twin = (twin >= 0) & (band == BACKWARD)
    a_tgt = np.r_[dst[cross], np.flatnonzero(has_twin)]
    a_src = np.r_[src[cross], twin[has_twin]]
    if sweeps > 0 and len(a_tgt):  # start the backward band as the mirror of the forward
        pos = _centered_slots(col, _barycentre(n, a_tgt, pos[a_src], pos), idx)
    sign = np.where(band == BACKWARD, -1.0, 1.0)
    best, best_c = pos, crossings(x, pos * sign, src, dst)
    for i in range(sweeps):
        down = i % 2 == 0
        tgt = np.r_[d_in if down else s_in, a_tgt]
        frm = np.r_[s_in if down else d_in, a_src]
        pos = _centered_slots(col, _barycentre(n, tgt, pos[frm], pos), pos)
        c = crossings(x, pos * sign, src, dst)
        if c < best_c:
            best, best_c = pos, c
    return best


def route_edges(x: np.ndarray, y: np.ndarray, src: np.ndarray,
                dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Polylines of all edges with NaN gaps: straight in a band, one bend across.

    Args:
        x: Node x.
        y: Node y.
        src: Edge sources.
        dst: Edge targets.

    Returns:
        ``(xs, ys)`` flat arrays for a single line trace.
    """
    bent = (y[src] > 0) != (y[dst] > 0)
    s1, d1 = src[~bent], dst[~bent]
    s2, d2 = src[bent], dst[bent]
    xs1 = np.full((len(s1), 3), np.nan)
    ys1 = np.full((len(s1), 3), np.nan)
    xs1[:, 0], xs1[:, 1], ys1[:, 0], ys1[:, 1] = x[s1], x[d1], y[s1], y[d1]
    xs2 = np.full((len(s2), 4), np.nan)
    ys2 = np.full((len(s2), 4), np.nan)
    xs2[:, 0], xs2[:, 1], xs2[:, 2] = x[s2], (x[s2] + x[d2]) / 2, x[d2]
    ys2[:, 0], ys2[:, 1], ys2[:, 2] = y[s2], 0.0, y[d2]
    return np.r_[xs1.ravel(), xs2.ravel()], np.r_[ys1.ravel(), ys2.ravel()]


def layered_layout(is_bwd: list[bool], src: np.ndarray, dst: np.ndarray,
                   twin: list[int] | None = None, *, sweeps: int = 4,
                   gap: float = 1.5) -> Layout:
    """Lay out a joint graph: forward band above, mirrored backward band below.

    Args:
        is_bwd: Per node, True when it belongs to the backward band.
        src: Edge sources (node indices, topological order).
        dst: Edge targets.
        twin: Per node, index of its forward twin or -1.
        sweeps: Barycentre passes for crossing reduction (bounded work).
        gap: Empty space between the bands, in slots.

    Returns:
        The :class:`Layout`.
    """
    n = len(is_bwd)
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    twin = list(twin) if twin is not None else [-1] * n
    preds, succs = _adjacency(n, src, dst)
    flayer = forward_layers(is_bwd, preds, succs)
    bucket, depth = backward_buckets(is_bwd, preds, twin, flayer)
    band = np.asarray(is_bwd, dtype=np.int8)
    fl, bk, dp = np.asarray(flayer), np.asarray(bucket), np.asarray(depth)
    nlayers = int(fl[band == FORWARD].max(initial=0)) + 1
    width = np.ones(nlayers, dtype=np.int64)
    if (band == BACKWARD).any():
        np.maximum.at(width, bk[band == BACKWARD], dp[band == BACKWARD] + 1)
    left = np.r_[0, np.cumsum(width)[:-1]]
    total = int(width.sum())
    bcol = left[bk] + width[bk] - 1 - dp
    fcol = left[fl] + (width[fl] - 1) / 2.0
    x = np.where(band == BACKWARD, bcol, fcol).astype(float)
    layer = np.where(band == BACKWARD, nlayers + (total - 1 - bcol), fl).astype(np.int64)
    col_key = np.where(band == BACKWARD, total + bcol, fcol * 2).astype(np.int64)
    tw = np.asarray(twin, dtype=np.int64)
    pos = order_columns(col_key, band, src, dst, tw, sweeps, x)
    half = float(np.abs(pos).max(initial=0.0)) + gap / 2.0
    y = np.where(band == BACKWARD, -(half + pos), half + pos)
    ex, ey = route_edges(x, y, src, dst)
    return Layout(x=x, y=y, layer=layer, band=band, edge_x=ex, edge_y=ey)


def crossings(x: np.ndarray, y: np.ndarray, src: np.ndarray, dst: np.ndarray) -> int:
    """Number of crossing pairs among edges joining neighbouring columns.

    The usual layered-drawing measure: only edges whose ends sit in adjacent
    distinct x positions count. Pairs inside a column gap are compared
    vectorised, O(E x the largest gap's edge count).

    Args:
        x: Node x (the column of each node).
        y: Node y.
        src: Edge sources (node indices).
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
