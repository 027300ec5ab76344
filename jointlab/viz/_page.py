"""A laid-out DAG fitted to a page: long chains wrapped into rows, a target aspect or width.

The layout (:mod:`jointlab.viz._layout`) gives every item a column position
and a slot; here the layers are cut into *strips* at layer boundaries (a cut
never splits a layer, so a backward item stays in its twin's strip), each
strip is one row of the page with its forward band over its backward band
(``arrange="stacked"``) or beside it (``"side"``), and the number of strips
is the one whose page comes closest to the target aspect ratio (or the
fewest that fit a target width). Inside a strip the layout is unchanged;
each band is only shifted to sit tight against its strip's edge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from jointlab.viz._layout import BACKWARD, Layout

ARRANGEMENTS = ("stacked", "side")
#: Pixels between the bands of a strip, between strips, and around the page.
BAND_GAP_PX, STRIP_GAP_PX, MARGIN_PX = 34.0, 40.0, 24.0
#: Most strips tried.
MAX_STRIPS = 60


@dataclass
class Strip:
    """One row of the page: its item columns and the pixel boxes of its bands.

    Attributes:
        fwd: ``(x0, y0, x1, y1)`` of the forward band (empty bands have ``x0 == x1``).
        bwd: ``(x0, y0, x1, y1)`` of the backward band.
    """

    fwd: tuple[float, float, float, float]
    bwd: tuple[float, float, float, float]


@dataclass
class Page:
    """Item centres in pixels and the strips they sit in.

    Attributes:
        cx: Centre x per item.
        cy: Centre y per item.
        strip: Strip index per item.
        strips: The strips, top to bottom.
        width: Page width (content plus margins, padded to the aspect ratio).
        height: Page height.
        top: Pixels reserved above the drawing (title).
        bottom: Pixels reserved below it (legend).
        legend_y: Where the space below the drawing starts.
    """

    cx: np.ndarray
    cy: np.ndarray
    strip: np.ndarray
    strips: list[Strip]
    width: float
    height: float
    top: float
    bottom: float
    legend_y: float


@dataclass
class _Fit:
    strip: np.ndarray  # per item
    x0: np.ndarray  # per strip: left edge (columns)
    span: np.ndarray  # per strip: width (columns)
    lo: np.ndarray  # per strip and band: lowest slot edge, shape (k, 2)
    hi: np.ndarray  # per strip and band: highest slot edge


def _slots(lay: Layout) -> np.ndarray:
    """Each item's slot position (its y with the band offset removed, backward unmirrored)."""
    return np.where(lay.band == BACKWARD, -lay.y - lay.half, lay.y - lay.half)


def _fit(lay: Layout, h: np.ndarray, k: int) -> _Fit:
    """Cut the layers into ``k`` strips of about equal width; drop empty strips."""
    left = lay.left
    nl = len(left) - 1
    total = float(left[-1] - left[0]) or 1.0
    mid = (left[:-1] + left[1:]) / 2 - left[0]
    of_layer = np.minimum((mid / (total / k)).astype(np.int64), k - 1)
    used, of_layer = np.unique(of_layer, return_inverse=True)
    k = len(used)
    lid = np.where(lay.band == BACKWARD, lay.bucket, lay.layer)
    strip = of_layer[lid] if len(lid) else np.zeros(0, dtype=np.int64)
    first = np.full(k, nl, dtype=np.int64)
    last = np.zeros(k, dtype=np.int64)
    np.minimum.at(first, of_layer, np.arange(nl))
    np.maximum.at(last, of_layer, np.arange(nl))
    x0 = left[first]
    span = left[last + 1] - x0
    pos = _slots(lay)
    lo = np.full((k, 2), np.inf)
    hi = np.full((k, 2), -np.inf)
    band = lay.band.astype(np.int64)
    np.minimum.at(lo, (strip, band), pos - h / 2)
    np.maximum.at(hi, (strip, band), pos + h / 2)
    empty = ~np.isfinite(lo)
    lo[empty], hi[empty] = 0.0, 0.0
    return _Fit(strip, x0, span, lo, hi)


def _size(f: _Fit, col_px: float, row_px: float, arrange: str) -> tuple[np.ndarray, np.ndarray]:
    """Per strip: width and height in pixels."""
    w = f.span * col_px
    hb = (f.hi - f.lo) * row_px
    both = (hb > 0).all(axis=1)
    if arrange == "stacked":
        return w, hb.sum(axis=1) + np.where(both, BAND_GAP_PX, 0.0)
    return np.where(both, 2 * w + BAND_GAP_PX, w), hb.max(axis=1)


def _page_size(f: _Fit, col_px: float, row_px: float, arrange: str, top: float,
               bottom: float) -> tuple[float, float]:
    w, h = _size(f, col_px, row_px, arrange)
    width = float(w.max(initial=0.0)) + 2 * MARGIN_PX
    height = top + float(h.sum()) + STRIP_GAP_PX * (len(h) - 1) + bottom + MARGIN_PX
    return width, height


def choose_strips(lay: Layout, h: np.ndarray, col_px: float, row_px: float, *,
                  aspect: float | None, width: float | None, arrange: str, top: float,
                  bottom: float) -> _Fit:
    """The strip cut whose page best meets the target.

    With ``width``: the fewest strips whose page is at most that wide (the most
    strips there are, if none is). Otherwise the page whose width/height is
    closest to ``aspect`` in log ratio.
    """
    layers = len(lay.left) - 1
    fits = [_fit(lay, h, k) for k in range(1, min(layers, MAX_STRIPS) + 1)]
    sizes = [_page_size(f, col_px, row_px, arrange, top, bottom) for f in fits]
    if width is not None:
        ok = [k for k, (w, _) in enumerate(sizes) if w <= width]
        return fits[ok[0] if ok else len(fits) - 1]
    target = aspect if aspect is not None else 1.0
    errs = [abs(math.log((w / hh) / target)) for w, hh in sizes]
    return fits[int(np.argmin(errs))]


def arrange_page(lay: Layout, h: np.ndarray, col_px: float, row_px: float, *,
                 aspect: float | None = 1.414, width: float | None = None,
                 arrange: str = "stacked", top: float = 60.0,
                 bottom_for: object = None) -> Page:
    """Item centres in pixels on a page meeting ``aspect`` / ``width``.

    Args:
        lay: The layout of the items.
        h: Slot height per item (rows), as given to the layout.
        col_px: Pixels per layout column.
        row_px: Pixels per layout row.
        aspect: Target width/height of the page; the page is padded to it exactly.
        width: Target page width in pixels (chooses the strip count).
        arrange: ``"stacked"`` (forward over backward) or ``"side"`` (side by side).
        top: Pixels above the drawing (title lines).
        bottom_for: ``callable(width) -> pixels`` below the drawing (the legend).

    Returns:
        The :class:`Page`.
    """
    bottom_of = bottom_for if callable(bottom_for) else (lambda _w: 0.0)
    guess = bottom_of(1200.0)
    f = choose_strips(lay, h, col_px, row_px, aspect=aspect, width=width, arrange=arrange,
                      top=top, bottom=guess)
    sw, sh = _size(f, col_px, row_px, arrange)
    content_w = float(sw.max(initial=0.0)) + 2 * MARGIN_PX
    bottom = float(bottom_of(max(content_w, width or 0.0)))
    pos = _slots(lay)
    cx = np.zeros(len(pos))
    cy = np.zeros(len(pos))
    strips, y = [], top
    for s in range(len(sw)):
        x0 = MARGIN_PX
        fh, bh = (f.hi[s] - f.lo[s]) * row_px
        gap = BAND_GAP_PX if fh > 0 and bh > 0 else 0.0
        if arrange == "stacked":
            fr = (x0, y, x0 + f.span[s] * col_px, y + fh)
            br = (x0, y + fh + gap, x0 + f.span[s] * col_px, y + fh + gap + bh)
        else:
            bx = x0 + (f.span[s] * col_px + gap if fh > 0 else 0.0)
            fr = (x0, y, x0 + f.span[s] * col_px, y + fh)
            br = (bx, y, bx + f.span[s] * col_px, y + bh)
        strips.append(Strip(fr, br))
        y += sh[s] + STRIP_GAP_PX
    sel = f.strip
    fwd = lay.band != BACKWARD
    rect = np.asarray([[st.fwd[0], st.fwd[1], st.bwd[0], st.bwd[1]] for st in strips])
    if len(pos):
        x_in = (lay.x - f.x0[sel]) * col_px
        cx = np.where(fwd, rect[sel, 0], rect[sel, 2]) + x_in
        cy = np.where(fwd, rect[sel, 1] + (f.hi[sel, 0] - pos) * row_px,
                      rect[sel, 3] + (pos - f.lo[sel, 1]) * row_px)
    legend_y = y - STRIP_GAP_PX + MARGIN_PX / 2
    height = legend_y + bottom + MARGIN_PX / 2
    page_w = max(content_w, 480.0)
    if aspect is not None:  # pad to the exact ratio, content centred horizontally
        if page_w / height < aspect:
            shift = (height * aspect - page_w) / 2
            cx = cx + shift
            strips = [Strip(_dx(st.fwd, shift), _dx(st.bwd, shift)) for st in strips]
            page_w = height * aspect
        else:
            height = page_w / aspect
    return Page(cx, cy, sel, strips, page_w, height, top, bottom, legend_y)


def _dx(r: tuple[float, float, float, float], d: float) -> tuple[float, float, float, float]:
    return (r[0] + d, r[1], r[2] + d, r[3])
