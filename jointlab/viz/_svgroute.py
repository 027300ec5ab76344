"""Routed lines for the static DAG's edges between wrapped rows (a U-Net's skip connection).

An edge whose ends sit in different rows of the page leaves its box through
the top or bottom edge (the side facing the other end unless another box of
its band is in the way), runs along the gutter beside that band, up or down a
vertical lane right of the drawing, along the gutter beside the other band and
into the other box. Gutter runs keep clear of the band captions; lanes are
reused where their vertical spans do not overlap. Edges that find no free exit
or lane are left to the caller (drawn as named stubs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jointlab.viz._page import Page

#: Pixels between neighbouring lanes, and from the drawing to the first lane.
LANE_PX, LANE_GAP = 6.0, 10.0
#: Gutter runs sharing one gutter step this far apart (at most GUTTER_STEPS steps).
GUTTER_STEP, GUTTER_STEPS = 2.0, 4


#: Advance of one caption character at 11 px (generous: a line keeps clear of it).
CAPTION_CHAR = 6.6


def caption(k: int, n: int, bwd: bool) -> str:
    """The caption over band ``bwd`` of row ``k`` of ``n``."""
    row = f" (row {k + 1} of {n})" if n > 1 else ""
    return f"← backward{row}" if bwd else f"forward →{row}"


def _under_caption(i: int, x: float, page: Page, bwd: np.ndarray) -> bool:
    """True when ``x`` is under the caption over item ``i``'s band.

    A line up from there would cross the caption.
    """
    k = int(page.strip[i])
    band = _band(page, k, bool(bwd[i]))
    return x < band[0] + CAPTION_CHAR * len(caption(k, len(page.strips), bool(bwd[i]))) + 4


def drawing_right(page: Page) -> float:
    """The right edge of the widest band (where the first lane goes beyond)."""
    return max((max(st.fwd[2], st.bwd[2]) for st in page.strips), default=0.0)


def _band(page: Page, strip: int, bwd: bool) -> tuple[float, float, float, float]:
    st = page.strips[strip]
    return st.bwd if bwd else st.fwd


def _gutter_y(page: Page, strip: int, bwd: bool, down: bool, k: int) -> float:
    """A run's y beside a band: just below it, or above it clear of its caption.

    Runs below one band and runs above the next share a gutter: the first fan down from
    its top, the second up from the caption, so the two sets never meet.
    """
    band = _band(page, strip, bwd)
    step = GUTTER_STEP * (k % GUTTER_STEPS)
    return band[3] + 1.5 + step if down else band[1] - 18 - step


def _blocked(i: int, x: float, down: bool, page: Page, bw: np.ndarray, bh: np.ndarray,
             bwd: np.ndarray) -> bool:
    """True when a vertical from item ``i``'s edge at ``x`` to its band's edge hits a box."""
    same = (page.strip == page.strip[i]) & (bwd == bwd[i])
    same[i] = False
    near = np.abs(page.cx - x) < bw / 2 + 3
    beyond = page.cy > page.cy[i] if down else page.cy < page.cy[i]
    return bool((same & near & beyond).any())


def _right_clear(i: int, page: Page, bw: np.ndarray, bh: np.ndarray) -> bool:
    """True when nothing of item ``i``'s row lies right of it at its height.

    A line may then run straight out of its right edge to the lanes.
    """
    row = page.strip == page.strip[i]
    level = np.abs(page.cy - page.cy[i]) < bh / 2 + 8
    right = page.cx - bw / 2 > page.cx[i]
    return not bool((row & level & right).any())


def _exit(i: int, toward_down: bool, page: Page, bw: np.ndarray, bh: np.ndarray,
          bwd: np.ndarray, used: dict[Any, Any]) -> tuple[float, str] | None:
    """An unobstructed exit of item ``i``: its x and way out (``down``, ``up``, ``right``).

    Through the bottom or top edge (toward the other end first) where no box of its band
    is in the way, else out of its right edge where nothing lies right of it.
    """
    k = used.get(i, 0)
    used[i] = k + 1
    shifts = [0.0, 0.3, -0.3, 0.6, -0.6, 0.85, -0.85]
    start = k % len(shifts)
    taken = used.setdefault(("x", i), [])  # one line per exit point: no merged arrows
    for down in (toward_down, not toward_down):
        for t in shifts[start:] + shifts[:start]:
            x = float(page.cx[i] + t * (bw[i] / 2))
            if not (_blocked(i, x, down, page, bw, bh, bwd)
                    or not down and _under_caption(i, x, page, bwd)
                    or any(abs(x - u) < 5 and w == down for u, w in taken)):
                taken.append((x, down))
                return x, "down" if down else "up"
    if _right_clear(i, page, bw, bh):
        return float(page.cx[i] + bw[i] / 2), "right"
    return None


def route_edges(pairs: Sequence[tuple[int, int]], page: Page, bw: np.ndarray, bh: np.ndarray,
                bwd: np.ndarray, max_lanes: int) -> tuple[dict[int, str], int]:
    """Path data of each edge between rows that could be routed, and the lanes used.

    Args:
        pairs: ``(source item, target item)`` per edge.
        page: The page the items sit on (stacked bands).
        bw: Box width per item.
        bh: Box height per item.
        bwd: True per backward item.
        max_lanes: Vertical lanes available right of the drawing.

    Returns:
        ``{edge index: SVG path data}`` and the number of lanes used.
    """
    used: dict[Any, Any] = {}
    gut: dict[tuple[int, bool, bool], int] = {}
    legs = []
    for e, (s, d) in enumerate(pairs):
        ss, sd = int(page.strip[s]), int(page.strip[d])
        if ss == sd:
            continue
        a = _exit(s, sd > ss, page, bw, bh, bwd, used)
        b = _exit(d, ss > sd, page, bw, bh, bwd, used)
        if a is None or b is None:
            continue
        ys = []
        for i, (_, way) in ((s, a), (d, b)):
            if way == "right":  # straight out at the box's height, fanned a little
                k = used.get(-1 - i, 0)
                used[-1 - i] = k + 1
                spread = (k % 5 - 2) * GUTTER_STEP * 1.5
                ys.append(float(page.cy[i] + min(abs(spread), bh[i] / 2 - 4)
                                * np.sign(spread)))
                continue
            key = (int(page.strip[i]), bool(bwd[i]), way == "down")
            ys.append(_gutter_y(page, key[0], key[1], way == "down", gut.get(key, 0)))
            gut[key] = gut.get(key, 0) + 1
        legs.append((e, s, d, a, b, ys[0], ys[1]))
    lanes: list[list[tuple[float, float]]] = []
    out: dict[int, str] = {}
    x_lane0 = drawing_right(page) + LANE_GAP
    for e, s, d, (xa, wa), (xb, wb), ya, yb in sorted(legs, key=lambda g: abs(g[6] - g[5])):
        lo, hi = min(ya, yb) - 2, max(ya, yb) + 2
        lane = next((k for k, spans in enumerate(lanes)
                     if all(hi < a or lo > b for a, b in spans)), len(lanes))
        if lane >= max_lanes:
            continue
        if lane == len(lanes):
            lanes.append([])
        lanes[lane].append((lo, hi))
        lx = x_lane0 + LANE_PX * lane
        start = (xa, ya) if wa == "right" else (
            xa, float(page.cy[s] + (bh[s] / 2 if wa == "down" else -bh[s] / 2)))
        end = (xb, yb) if wb == "right" else (
            xb, float(page.cy[d] + (bh[d] / 2 if wb == "down" else -bh[d] / 2)))
        pts = [start, (xa, ya), (lx, ya), (lx, yb), (xb, yb), end]
        pts = [p for k, p in enumerate(pts) if k == 0 or p != pts[k - 1]]
        out[e] = " ".join(f"{'L' if k else 'M'}{x:.1f},{y:.1f}" for k, (x, y) in enumerate(pts))
    return out, len(lanes)
