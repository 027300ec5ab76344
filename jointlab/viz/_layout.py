"""The layered layout of a joint graph's visible items: the one DAG layout of jointlab.

This module is the specification. ``static/dag_layout.js`` (``layeredLayout``,
``topoOrder`` and the helpers they call) runs the same steps in the browser
over the visible items of ``dag_view`` (open nodes, closed group boxes, open
groups' blocks); the static export (:mod:`jointlab.viz.export`) runs this
one. ``tests/test_layout_parity.py`` feeds both the same item sets from real
graphs and asserts identical positions, so a change here needs the same
change there (and the other way round).

The drawing has two bands that share one horizontal axis:

- the forward band (parameters, inputs, forward ops) above, data flowing
  left to right, one layer per longest-path step;
- the backward band below, data flowing right to left, each backward item
  sitting under the forward layer of its twin (the item it differentiates).

Items come in a topological order (:func:`topo_order`); an edge ``u -> v``
with ``u >= v`` (a cycle through a closed box: a module called twice) is
kept for drawing but ignored by the layering. Each item has a width ``w``
(in columns) and a slot height ``h`` (in rows). Steps:

1. Longest-path layers of the forward items; *feeders* (sources, and items
   fed by feeders only: weights and their transposes) move next to their
   first user.
2. Each backward item gets a *bucket*: the forward layer of its twin (the
   last layer when it has none), capped by the buckets of its backward
   predecessors so buckets never increase along an edge, and a depth inside
   the bucket (its longest backward path from the bucket's entry).
3. Columns: a forward layer is as wide as its widest item, or as its
   bucket's backward columns side by side (depth 0 on the right), whichever
   is wider.
4. Vertical order in each column: items in order, then the backward band as
   the mirror of the forward (keys: twin and forward inputs only), then
   :data:`SWEEPS` barycentre sweeps alternating down and up. Each column is
   sorted by key (ties: previous position, then index) and stacked by
   height, centred on 0. A sweep can undo what the one before gained, so
   the order kept is the first with the fewest crossings between
   neighbouring columns (the count of :mod:`jointlab.viz._crossings`) among
   the mirror and every sweep.
5. ``y`` is the slot position offset by half the tallest column plus
   :data:`BAND_GAP`, forward up, backward mirrored down.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from jointlab.viz._crossings import crossing_count, gap_edges

FORWARD, BACKWARD = 0, 1
#: Barycentre sweeps after the mirror pass (``SWEEPS`` in dag_layout.js).
SWEEPS = 4
#: Empty rows between the bands (``BAND_GAP`` in dag_layout.js).
BAND_GAP = 1.5
#: Item sizes the view gives its layout (dag_model.js): a node is 1 column wide in a slot of
#: ``NODE_SLOT`` rows, a closed group's box ``BOX_COLS`` columns wide in ``BOX_SLOT`` rows.
NODE_SLOT = 1.0
BOX_COLS = 2
BOX_SLOT = 2.4


@dataclass
class Layout:
    """Positions of the items.

    Attributes:
        x: Horizontal centre per item (column units).
        y: Vertical centre per item (rows; forward > 0 > backward).
        layer: Forward layer per forward item (0 for backward items).
        bucket: Bucket (mirrored forward layer) per backward item (0 for forward items).
        band: ``FORWARD`` or ``BACKWARD`` per item.
        left: Left edge of every forward layer, and the right edge of the last (columns);
            a backward item lies inside its bucket's span.
        half: The offset of the slot positions from 0 (``y = half + slot`` forward,
            ``-(half + slot)`` backward).
        edge_x: Edge polylines' x coordinates, NaN between edges (:func:`route_edges`).
        edge_y: Edge polylines' y coordinates, NaN between edges.
    """

    x: np.ndarray
    y: np.ndarray
    layer: np.ndarray
    bucket: np.ndarray
    band: np.ndarray
    left: np.ndarray
    half: float
    edge_x: np.ndarray
    edge_y: np.ndarray


def _lists(n: int, a: Sequence[int], b: Sequence[int], keep: Sequence[bool]) -> list[list[int]]:
    """For each ``a[k]`` (where ``keep[k]``), its ``b[k]`` in edge order (``csr`` in JS)."""
    out: list[list[int]] = [[] for _ in range(n)]
    for k, (u, v) in enumerate(zip(a, b)):
        if keep[k]:
            out[u].append(v)
    return out


def topo_order(n: int, rank: Sequence[float], src: Sequence[int], dst: Sequence[int]
               ) -> list[int]:
    """A topological order (Kahn), the lowest rank first among the ready items.

    On a cycle the lowest-ranked item left goes next.

    Args:
        n: Item count.
        rank: Distinct numbers, one per item (the graph order of its first node).
        src: Edge sources.
        dst: Edge targets.

    Returns:
        The items in order.
    """
    out = _lists(n, src, dst, [s != d for s, d in zip(src, dst)])
    indeg = [0] * n
    for v in range(n):
        for w in out[v]:
            indeg[w] += 1
    ready = [(rank[v], v) for v in range(n) if not indeg[v]]
    heapq.heapify(ready)
    by_rank = sorted(range(n), key=lambda v: rank[v])
    done, order, nxt = [False] * n, [], 0
    while len(order) < n:
        if ready:
            v = heapq.heappop(ready)[1]
        else:  # a cycle: break it at the lowest rank left
            while done[by_rank[nxt]]:
                nxt += 1
            v = by_rank[nxt]
        if done[v]:
            continue
        done[v] = True
        order.append(v)
        for w in out[v]:
            if not done[w]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    heapq.heappush(ready, (rank[w], w))
    return order


def forward_layers(band: Sequence[int], preds: list[list[int]], succs: list[list[int]]
                   ) -> list[int]:
    """Longest-path layers of the forward items, feeders moved next to their first user.

    Returns:
        The layer per item (0 for backward items).
    """
    n = len(band)
    layer, feeder = [0] * n, [False] * n
    for v in range(n):
        if band[v]:
            continue
        best, only_feeders = -1, True
        for u in preds[v]:
            if band[u]:
                continue
            best = max(best, layer[u])
            only_feeders = only_feeders and feeder[u]
        layer[v], feeder[v] = best + 1, only_feeders
    for v in range(n - 1, -1, -1):
        if band[v] or not feeder[v]:
            continue
        users = [layer[w] for w in succs[v] if not band[w]]
        if users:
            layer[v] = max(layer[v], min(users) - 1)
    return layer


def backward_buckets(band: Sequence[int], preds: list[list[int]], twin: Sequence[int],
                     layer: list[int]) -> tuple[int, list[int], list[int]]:
    """The last forward layer, and each backward item's bucket and depth inside it."""
    n = len(band)
    top = max((layer[v] for v in range(n) if not band[v]), default=0)
    bucket, depth = [0] * n, [0] * n
    for v in range(n):
        if not band[v]:
            continue
        t = twin[v]
        k = layer[t] if t >= 0 and not band[t] else top
        for u in preds[v]:
            if band[u]:
                k = min(k, bucket[u])
        d = 0
        for u in preds[v]:
            if band[u] and bucket[u] == k:
                d = max(d, depth[u] + 1)
        bucket[v], depth[v] = k, d
    return top, bucket, depth


def columns_of(band: Sequence[int], w: Sequence[float], layer: list[int], top: int,
               bucket: list[int], depth: list[int]
               ) -> tuple[list[float], list[int], list[float]]:
    """Centre ``x`` and column key of every item, and the left edge of every layer.

    The bands never share a column key; ``left`` has one more entry, the right
    edge of the last layer.
    """
    n = len(band)
    deep = [0] * (top + 1)
    for v in range(n):
        if band[v]:
            deep[bucket[v]] = max(deep[bucket[v]], depth[v] + 1)
    first = [0] * (top + 2)
    for lv in range(top + 1):
        first[lv + 1] = first[lv] + deep[lv]
    sub, span = [0.0] * first[top + 1], [0.0] * (top + 1)
    for v in range(n):
        if band[v]:
            d = first[bucket[v]] + depth[v]
            sub[d] = max(sub[d], float(w[v]))
        else:
            span[layer[v]] = max(span[layer[v]], float(w[v]))
    left, right = [0.0] * (top + 2), [0.0] * len(sub)
    for lv in range(top + 1):
        s = 0.0
        for d in range(first[lv], first[lv + 1]):
            s += sub[d]
        span[lv] = max(span[lv], s, 1.0)
        left[lv + 1] = left[lv] + span[lv]
        r = left[lv + 1]
        for d in range(first[lv], first[lv + 1]):
            right[d] = r
            r -= sub[d]
    x, col = [0.0] * n, [0] * n
    for v in range(n):
        if band[v]:
            d = first[bucket[v]] + depth[v]
            x[v], col[v] = right[d] - sub[d] / 2, top + 1 + d
        else:
            x[v], col[v] = left[layer[v]] + span[layer[v]] / 2, layer[v]
    return x, col, left


def _stack(columns: list[list[int]], key: Sequence[float], h: Sequence[float],
           pos: list[float]) -> None:
    """Sort each column by key (ties: position, index) and stack by height, centred on 0."""
    for col in columns:
        col.sort(key=lambda v: (key[v], pos[v], v))
        c = -sum_in_order(h[v] for v in col) / 2
        for v in col:
            pos[v] = c + h[v] / 2
            c += h[v]


def sum_in_order(values: object) -> float:
    """Left-to-right float sum (as JS adds), not ``math.fsum``."""
    total = 0.0
    for x in values:  # type: ignore[attr-defined]
        total += x
    return total


def _barycentres(band: Sequence[int], preds: list[list[int]], succs: list[list[int]],
                 twin: Sequence[int], pos: list[float], down: bool, anchors_only: bool
                 ) -> list[float]:
    """Sort key per item: the mean position of its neighbours.

    Those are its same-band neighbours on the side the sweep comes from (none when
    ``anchors_only``) and, for a backward item, its twin and its forward inputs.
    """
    n = len(band)
    key = [0.0] * n
    near = preds if down else succs
    for v in range(n):
        s, c = 0.0, 0
        if not anchors_only:
            for u in near[v]:
                if band[u] == band[v]:
                    s += pos[u]
                    c += 1
        if band[v]:
            t = twin[v]
            if t >= 0 and not band[t]:
                s += pos[t]
                c += 1
            for u in preds[v]:
                if not band[u]:
                    s += pos[u]
                    c += 1
        key[v] = s / c if c else pos[v]
    return key


def band_y(band: Sequence[int], pos: Sequence[float], h: Sequence[float]
           ) -> tuple[list[float], float]:
    """Each item's y (forward up, backward mirrored down) and the bands' half gap."""
    half = 0.0
    for v in range(len(band)):
        half = max(half, abs(pos[v]) + h[v] / 2)
    half += BAND_GAP / 2
    return [-(half + pos[v]) if band[v] else half + pos[v] for v in range(len(band))], half


def layered_layout(is_bwd: Sequence[bool], src: Sequence[int], dst: Sequence[int],
                   twin: Sequence[int] | None = None, *, w: Sequence[float] | None = None,
                   h: Sequence[float] | None = None, sweeps: int = SWEEPS) -> Layout:
    """Lay out items: forward band above, the backward band mirrored below.

    Args:
        is_bwd: Per item, True when it belongs to the backward band.
        src: Edge sources (item indices, items in a topological order).
        dst: Edge targets.
        twin: Per item, the index of its forward twin or -1.
        w: Width per item in columns (1 by default).
        h: Slot height per item in rows (1 by default).
        sweeps: Barycentre sweeps after the mirror pass.

    Returns:
        The :class:`Layout`.
    """
    n = len(is_bwd)
    band = [1 if b else 0 for b in is_bwd]
    src = [int(s) for s in src]
    dst = [int(d) for d in dst]
    tw = [int(t) for t in twin] if twin is not None else [-1] * n
    wv = [float(a) for a in w] if w is not None else [1.0] * n
    hv = [float(a) for a in h] if h is not None else [1.0] * n
    fwd = [s < d for s, d in zip(src, dst)]
    succs, preds = _lists(n, src, dst, fwd), _lists(n, dst, src, fwd)
    layer = forward_layers(band, preds, succs)
    top, bucket, depth = backward_buckets(band, preds, tw, layer)
    x, colof, left = columns_of(band, wv, layer, top, bucket, depth)
    cols: dict[int, list[int]] = {}
    for v in range(n):
        cols.setdefault(colof[v], []).append(v)
    columns = [cols[c] for c in sorted(cols)]
    pos = [0.0] * n
    _stack(columns, [float(v) for v in range(n)], hv, pos)
    _stack(columns, _barycentres(band, preds, succs, tw, pos, True, True), hv, pos)  # mirror
    gaps = gap_edges(x, src, dst)
    best = band_y(band, pos, hv)  # the y (and half gap) of the order kept
    fewest = crossing_count(gaps, best[0])
    for s in range(sweeps):
        _stack(columns, _barycentres(band, preds, succs, tw, pos, s % 2 == 0, False), hv, pos)
        placed = band_y(band, pos, hv)
        count = crossing_count(gaps, placed[0])
        if count < fewest:
            best, fewest = placed, count
    y, half = best
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    sa, da = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    ex, ey = route_edges(xa, ya, sa, da)
    return Layout(x=xa, y=ya, layer=np.asarray(layer, dtype=np.int64),
                  bucket=np.asarray(bucket, dtype=np.int64),
                  band=np.asarray(band, dtype=np.int8), left=np.asarray(left, dtype=float),
                  half=half, edge_x=ex, edge_y=ey)


def route_edges(x: np.ndarray, y: np.ndarray, src: np.ndarray,
                dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Polylines of all edges with NaN gaps: straight in a band, one bend across.

    Args:
        x: Item x.
        y: Item y.
        src: Edge sources.
        dst: Edge targets.

    Returns:
        ``(xs, ys)`` flat arrays.
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
