"""SVG text of a labelled DAG on a page: boxes, routed edges, band captions, a bounded legend.

Positions come from :func:`jointlab.viz._layout.layered_layout` (the layout
``dag_view`` runs in the browser) arranged on a page by
:mod:`jointlab.viz._page`; colours from :mod:`jointlab.viz._style` (module
colours keyed by module name in graph order, the view's palette). This module
turns them into plain SVG 1.1 elements. Every string from the model is
XML-escaped. The root has a ``viewBox`` and ``width="100%"``, so an inline
SVG in a notebook scales to the cell instead of being clipped. Nothing here
needs a browser, network or plotly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from jointlab.meta import module_label
from jointlab.units import human_bytes, human_count
from jointlab.viz import _legend, _svgroute
from jointlab.viz._page import Page
from jointlab.viz._style import PHASE_COLORS

FONT = "DejaVu Sans, Verdana, Arial, sans-serif"
#: Approximate advance of one character at 12 px bold (DejaVu Sans is wide).
CHAR_W = 7.6
#: Drawn heights of a module box and of a node, pixels per layout row, and the gap
#: between neighbouring columns.
BOX_H, NODE_H, ROW_PX, COL_GAP = 44.0, 36.0, 46.0, 30.0
MAX_LABEL = 26
TITLE_PX = 84.0
LEGEND_ROW, LEGEND_ENTRY = 18.0, 250.0
#: Length of the stubs of an edge between rows.
STUB = 14.0
#: Legend rows at most (the entries beyond end in one "+N more").
LEGEND_ROWS = 3


def short(text: str, limit: int = MAX_LABEL) -> str:
    """``text`` cut to ``limit`` characters with a middle ellipsis.

    A dotted name keeps its last parts whole (``transfo…h.0.self_attention``), anything
    else both ends.
    """
    if len(text) <= limit:
        return text
    keep = limit - 1
    parts = text.split(".")
    for k in range(min(3, len(parts) - 1), 0, -1):  # the longest tail of whole parts that fits
        tail = ".".join(parts[-k:])
        if len(tail) <= keep - 3:
            return text[: keep - len(tail)] + "…" + tail
    return text[: keep // 2] + "…" + text[len(text) - (keep - keep // 2):]


def is_group(info: dict[str, Any]) -> bool:
    """True for the facts of a module group (from ``collapse``)."""
    return "count" in info


def node_lines(info: dict[str, Any], name: str) -> tuple[str, str]:
    """The two label lines of one graph node: its FQN or name, then module and shape."""
    first = info.get("fqn") or info.get("input_path") or name
    shape = info.get("shape")
    dims = "×".join(map(str, shape)) if shape is not None else ""
    second = " · ".join(x for x in (module_label(str(info.get("module") or "")), dims) if x)
    return short(str(first)), short(second, MAX_LABEL + 8)


def group_lines(info: dict[str, Any]) -> tuple[str, str]:
    """The two label lines of a group box: module, then ops / FLOPs / bytes."""
    second = f"{info['count']} ops"
    if info.get("flops"):
        second += f" · {human_count(info['flops'], 'FLOP')}"
    elif info.get("bytes"):
        second += f" · {human_bytes(info['bytes'])}"
    return short(str(info["module"])), second


def item_lines(data: Any) -> list[tuple[str, str]]:
    """Both label lines of every item."""
    return [group_lines(i) if is_group(i) else node_lines(i, n)
            for i, n in zip(data.info, data.names)]


def box_width(lines: Sequence[tuple[str, str]]) -> float:
    """Pixel width of a box holding the widest of ``lines`` (bold line 1, small line 2)."""
    widest = max((max(len(a), 0.8 * len(b)) for a, b in lines), default=8)
    return max(96.0, widest * CHAR_W + 16)


def tint(color: str, t: float = 0.8) -> str:
    """``#rrggbb`` mixed with white (``t`` = share of white)."""
    rgb = [int(color[k:k + 2], 16) for k in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * t):02x}" for c in rgb)


# -- legend ---------------------------------------------------------------------------------
def legend_entries(keys: Sequence[str], colors: dict[str, str]) -> list[tuple[str, str, str]]:
    """``(short name, full name, colour)`` per distinct key, in order, bounded.

    At most :data:`jointlab.viz._legend.LEGEND_LEVELS` entries, names cut to
    :data:`~jointlab.viz._legend.LABEL_MAX` characters (the full name in the entry's
    tooltip); the rest in one ``+N more`` entry whose tooltip lists them.
    """
    uniq = list(dict.fromkeys(keys))
    cap = _legend.LEGEND_LEVELS
    out = [(_legend.cut(k, _legend.LABEL_MAX), k, colors[k]) for k in uniq[:cap]]
    if len(uniq) > cap:
        rest = uniq[cap:]
        out.append((f"+{len(rest)} more", ", ".join(rest), ""))
    return out


def legend_height(n_entries: int, width: float) -> float:
    """Pixels the legend takes at this page width (0 without entries)."""
    if not n_entries:
        return 0.0
    per_row = max(int((width - 48) // LEGEND_ENTRY), 1)
    rows = min(-(-n_entries // per_row), LEGEND_ROWS + 1)
    return rows * LEGEND_ROW + 8


def legend_svg(entries: list[tuple[str, str, str]], y0: float, width: float) -> list[str]:
    """The legend below the drawing, entries in rows (never over the drawing)."""
    per_row = max(int((width - 48) // LEGEND_ENTRY), 1)
    out = ['<g class="legend">']
    for k, (label, full, color) in enumerate(entries):
        x = 24 + (k % per_row) * LEGEND_ENTRY
        y = y0 + (k // per_row) * LEGEND_ROW + 12
        swatch = (f'<rect x="{x:.1f}" y="{y - 10:.1f}" width="12" height="12" rx="2" '
                  f'fill="{tint(color, 0.55)}" stroke="{color}"/>' if color else "")
        out.append(f'<g class="legend-entry"><title>{escape(full)}</title>{swatch}'
                   f'<text x="{x + 17:.1f}" y="{y:.1f}" font-size="11">{escape(label)}</text></g>')
    out.append("</g>")
    return out


# -- edges ----------------------------------------------------------------------------------
def _clip(x0: float, y0: float, x1: float, y1: float, hw: float, hh: float
          ) -> tuple[float, float]:
    """Where the segment from (x0, y0) to the centre (x1, y1) enters that box."""
    dx, dy = x1 - x0, y1 - y0
    t = min(hw / abs(dx) if dx else np.inf, hh / abs(dy) if dy else np.inf)
    return (x1 - dx * min(t, 1.0), y1 - dy * min(t, 1.0))


def _stub_label(text: str, x: float, y: float, anchor: str, row: int, page_w: float) -> str:
    """The other end of an edge between rows, named beside its stub (``→ cat_1 (row 3)``).

    Kept on the page: moved up a line, inside the margin, where it would run off.
    """
    w = 5.2 * len(text)  # 9 px font
    if anchor == "end" and x - w < 4:
        x, y, anchor = 4.0, y - 9, "start"
    elif anchor == "start" and x + w > page_w - 4:
        x, y, anchor = page_w - 4, y - 9, "end"
    return (f'<text class="edge-end" x="{x:.1f}" y="{y - 3:.1f}" text-anchor="{anchor}" '
            f'font-size="9" fill="#666" stroke="none" data-row="{row}">{escape(text)}</text>')


#: Stub names drawn at most per box side (one line each); further stubs there stay unnamed.
STUB_NAMES = 2


def _edge(s: int, d: int, page: Page, bw: np.ndarray, bh: np.ndarray, bwd: np.ndarray,
          names: Sequence[str] = (), ids: Sequence[str] = (),
          taken: dict[tuple[int, float], int] | None = None) -> str:
    path = _edge_path(s, d, page, bw, bh, bwd, names, {} if taken is None else taken)
    return path.replace("<path ", f"<path data-src={quoteattr(ids[s])} "
                        f"data-dst={quoteattr(ids[d])} ", 1) if ids else path


def _stub_names(s: int, d: int, a: float, b: float, y0: float, y1: float, out: float,
                page: Page, names: Sequence[str], taken: dict[tuple[int, float], int]) -> str:
    """Both stubs' names, one line lower for each stub named before on that box side."""
    ss, sd = int(page.strip[s]), int(page.strip[d])
    far, near = ("start", "end") if out > 0 else ("end", "start")
    parts = []
    for box, side, text, x, y, anchor, row in (
            (s, out, f"→ {short(names[d], 18)} (row {sd + 1})", a + out * 2, y0, far, sd),
            (d, -out, f"{short(names[s], 18)} (row {ss + 1}) →", b - out * 2, y1, near, ss)):
        k = taken.get((box, side), 0)
        taken[(box, side)] = k + 1
        if k < STUB_NAMES:
            parts.append(_stub_label(text, x, y + 11 * k, anchor, row, page.width))
    return "".join(parts)


def _edge_path(s: int, d: int, page: Page, bw: np.ndarray, bh: np.ndarray, bwd: np.ndarray,
               names: Sequence[str], taken: dict[tuple[int, float], int]) -> str:
    cx, cy = page.cx, page.cy
    hs, hd = (bw[s] / 2, bh[s] / 2), (bw[d] / 2, bh[d] / 2)
    x0, y0, x1, y1 = cx[s], cy[s], cx[d], cy[d]
    ss, sd = int(page.strip[s]), int(page.strip[d])
    if ss != sd:  # to another row: a dashed stub out of one box and into the other, each
        out = 1.0 if sd > ss else -1.0  # naming the box at its other end and that box's row
        a = x0 + out * hs[0]
        b = x1 - out * hd[0]
        ends = _stub_names(s, d, a, b, y0, y1, out, page, names, taken) if names else ""
        return (f'<path class="edge-cut" d="M{a:.1f},{y0:.1f} h{out * STUB:.1f} '
                f'M{b - out * STUB:.1f},{y1:.1f} H{b:.1f}" stroke-dasharray="3 2" '
                'marker-end="url(#arrow)"/>' + ends)
    if bwd[s] != bwd[d] and page.strips[ss].bwd[1] > page.strips[ss].fwd[3]:  # via the gap
        mid_y = (page.strips[ss].fwd[3] + page.strips[ss].bwd[1]) / 2
        mx = (x0 + x1) / 2
        a, b = _clip(mx, mid_y, x0, y0, *hs), _clip(mx, mid_y, x1, y1, *hd)
        return (f'<path class="edge" d="M{a[0]:.1f},{a[1]:.1f} L{mx:.1f},{mid_y:.1f} '
                f'L{b[0]:.1f},{b[1]:.1f}" marker-end="url(#arrow)"/>')
    a, b = _clip(x1, y1, x0, y0, *hs), _clip(x0, y0, x1, y1, *hd)
    return (f'<path class="edge" d="M{a[0]:.1f},{a[1]:.1f} L{b[0]:.1f},{b[1]:.1f}" '
            'marker-end="url(#arrow)"/>')


# -- boxes and page -------------------------------------------------------------------------
def _box(info: dict[str, Any], name: str, lines: tuple[str, str], x: float, y: float,
         w: float, h: float, color: str, row: int, band: int) -> str:
    line1, line2 = lines
    tip = escape(f"{name}: {info['count']} nodes" if is_group(info) else f"{name}: {line2}")
    return (f'<g class="group" data-name={quoteattr(name)} data-row="{row}" '
            f'data-band="{"backward" if band else "forward"}"><title>{tip}</title>'
            f'<rect x="{x - w / 2:.1f}" y="{y - h / 2:.1f}" width="{w:.1f}" '
            f'height="{h:.1f}" rx="5" fill="{tint(color)}" stroke="{color}" '
            'stroke-width="1.4"/>'
            f'<text class="label" x="{x:.1f}" y="{y - 3:.1f}" text-anchor="middle" '
            f'font-size="12" font-weight="bold">{escape(line1)}</text>'
            f'<text class="sub" x="{x:.1f}" y="{y + 12:.1f}" text-anchor="middle" '
            f'font-size="10" fill="#444">{escape(line2)}</text></g>')


#: A white outline under a caption's letters: an edge of its row drawn through the band gap
#: (forward box to the backward box under it) passes under the caption, not over it.
HALO = ' stroke="white" stroke-width="4" paint-order="stroke"'


def _captions(page: Page) -> list[str]:
    """Band captions, drawn over the edges (routed lines keep clear of them)."""
    out = []
    n = len(page.strips)
    for k, st in enumerate(page.strips):
        if st.fwd[2] > st.fwd[0] and st.fwd[3] > st.fwd[1]:
            out.append(f'<text class="band" x="{st.fwd[0]:.1f}" y="{st.fwd[1] - 8:.1f}" '
                       f'font-size="11" fill="{PHASE_COLORS["forward"]}"{HALO}>'
                       f'{_svgroute.caption(k, n, False)}</text>')
        if st.bwd[2] > st.bwd[0] and st.bwd[3] > st.bwd[1]:
            out.append(f'<text class="band" x="{st.bwd[0]:.1f}" y="{st.bwd[1] - 8:.1f}" '
                       f'font-size="11" fill="{PHASE_COLORS["backward"]}"{HALO}>'
                       f'{_svgroute.caption(k, n, True)}</text>')
    return out


def _routed(d: str, s: int, t: int, names: Sequence[str], ids: Sequence[str]) -> str:
    """An edge between rows drawn as a routed line, its two ends named in its tooltip."""
    tip = escape(f"{names[s]} → {names[t]}")
    return (f'<path class="edge-route" data-src={quoteattr(ids[s])} '
            f'data-dst={quoteattr(ids[t])} d="{d}" marker-end="url(#arrow)">'
            f'<title>{tip}</title></path>')


def _routes(data: Any, page: Page, sizes: tuple[np.ndarray, np.ndarray], bwd: np.ndarray,
            aspect: float | None, max_width: float | None
            ) -> tuple[dict[int, str], float, float]:
    """Routed lines of the edges between rows, and the page size widened for their lanes.

    Only stacked pages are routed (side by side, rows keep their named stubs). The
    lanes take at most what ``max_width`` leaves; a page padded to ``aspect`` keeps it.
    """
    w, h = page.width, page.height
    stacked = all(st.bwd[1] >= st.fwd[3] or st.bwd[2] <= st.bwd[0] or st.fwd[2] <= st.fwd[0]
                  for st in page.strips)
    if len(page.strips) < 2 or not stacked:
        return {}, w, h
    right = _svgroute.drawing_right(page) + _svgroute.LANE_GAP
    room = (max_width if max_width is not None else 1e9) - right - 8
    lanes_max = int(room // _svgroute.LANE_PX) + 1 if room >= 0 else 0
    pairs = list(zip(data.src.tolist(), data.dst.tolist()))
    routes, lanes = _svgroute.route_edges(pairs, page, *sizes, bwd, lanes_max)
    need = right + _svgroute.LANE_PX * max(lanes - 1, 0) + 8 if lanes else 0.0
    if need > w:
        w = need
        h = max(h, w / aspect) if aspect is not None else h
    return routes, w, h


def dag_svg(data: Any, page: Page, sizes: tuple[np.ndarray, np.ndarray], colors: list[str],
            legend: list[tuple[str, str, str]], title: str, subtitle: str,
            aspect: float | None = None, max_width: float | None = None) -> str:
    """The SVG document of a laid-out DAG.

    Args:
        data: :class:`jointlab.viz._dagdata.DagData` (groups when collapsed).
        page: Item centres and strips from :func:`jointlab.viz._page.arrange_page`.
        sizes: Box width and height per item, in pixels.
        colors: Colour per item.
        legend: Entries from :func:`legend_entries`.
        title: The heading line.
        subtitle: The line under it.
        aspect: The page's width/height, kept when lanes widen it (None: no target).
        max_width: The widest the page may grow for the lanes of routed edges.

    Returns:
        The SVG text; one ``<g class="group">`` per item, one ``<path class="edge">``
        per edge inside a row, one ``<path class="edge-route">`` per edge between rows
        routed through the gutters (under the boxes), and one ``<path class="edge-cut">``
        (two stubs, named) per edge between rows that found no route.
    """
    bw, bh = sizes
    bwd = np.asarray(data.is_bwd, dtype=bool)
    routes, w, h = _routes(data, page, sizes, bwd, aspect, max_width)
    chars = max(int((w - 48) / 8.5), 20)
    firsts, taken = [ln[0] for ln in item_lines(data)], {}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="jl-dag-static" width="100%" '
        f'viewBox="0 0 {w:.0f} {h:.0f}" data-width="{w:.0f}" data-height="{h:.0f}" '
        f'font-family="{FONT}" style="max-width:100%;height:auto">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#8a8a9a"/></marker></defs>',
        f'<rect width="{w:.0f}" height="{h:.0f}" fill="white"/>',
        f'<text class="title" x="24" y="30" font-size="15" font-weight="bold">'
        f'<title>{escape(title)}</title>{escape(short(title, chars))}</text>',
        f'<text class="subtitle" x="24" y="48" font-size="11" fill="#555">'
        f'{escape(short(subtitle, int(chars * 1.25)))}</text>',
        '<g fill="none" stroke="#8a8a9a" stroke-width="1.1">',
        *(_routed(routes[e], s, d, firsts, data.names) if e in routes
          else _edge(s, d, page, bw, bh, bwd, firsts, data.names, taken)
          for e, (s, d) in enumerate(zip(data.src.tolist(), data.dst.tolist()))),
        "</g>",
        *_captions(page),
        *(_box(m, data.names[i], lines, page.cx[i], page.cy[i], bw[i], bh[i], colors[i],
               int(page.strip[i]), int(bwd[i]))
          for i, (m, lines) in enumerate(zip(data.info, item_lines(data)))),
        *legend_svg(legend, page.legend_y, w),
        "</svg>",
    ]
    return "\n".join(parts)
