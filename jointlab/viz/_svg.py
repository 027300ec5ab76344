"""SVG text of a labelled DAG: module-group boxes, routed edges, bands, legend.

The positions come from :func:`jointlab.viz._layout.layered_layout` (the one
the interactive DAG uses); this module turns them into pixels and writes
plain SVG 1.1 elements. Every string from the model is XML-escaped. Nothing
here needs a browser or network.
"""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from jointlab.units import human_bytes, human_count

FONT = "DejaVu Sans, Verdana, Arial, sans-serif"
#: Approximate advance of one character at 12 px (DejaVu Sans is wide).
CHAR_W = 7.3
BOX_H = 36.0
ROW_GAP = 18.0
COL_GAP = 34.0
MARGIN = 24.0
HEADER = 46.0
MAX_LABEL = 26
PHASE_FILL = {"forward": "#dbe8f6", "backward": "#f8dcdc", "output": "#e8def3"}
PHASE_STROKE = {"forward": "#1f77b4", "backward": "#d62728", "output": "#9467bd"}


def short(text: str, limit: int = MAX_LABEL) -> str:
    """``text`` cut to ``limit`` characters with a middle ellipsis (``transf…h.11``)."""
    if len(text) <= limit:
        return text
    keep = limit - 1
    return text[: keep // 2] + "…" + text[len(text) - (keep - keep // 2):]


def is_group(info: dict[str, Any]) -> bool:
    """True for the facts of a module group (a ``plot_dag`` figure drawn collapsed)."""
    return "count" in info


def node_lines(info: dict[str, Any], name: str) -> tuple[str, str]:
    """The two label lines of one graph node: its FQN or name, then module and shape."""
    first = info.get("fqn") or info.get("input_path") or name
    shape = info.get("shape")
    dims = "×".join(map(str, shape)) if shape is not None else ""
    second = " · ".join(x for x in (str(info.get("module") or "(root)"), dims) if x)
    return short(str(first)), short(second, MAX_LABEL + 8)


def group_lines(info: dict[str, Any]) -> tuple[str, str]:
    """The two label lines of a group box: module, then ops / FLOPs / bytes."""
    second = f"{info['count']} ops"
    if info.get("flops"):
        second += f" · {human_count(info['flops'], 'FLOP')}"
    elif info.get("bytes"):
        second += f" · {human_bytes(info['bytes'])}"
    return short(str(info["module"])), second


def _pixels(lay: Any, box_w: float) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Box centres in pixels, and the canvas size."""
    xs = np.unique(lay.x)
    col = {v: k for k, v in enumerate(xs)}  # columns ranked: gaps in x collapse
    cx = MARGIN + box_w / 2 + np.asarray([col[v] for v in lay.x]) * (box_w + COL_GAP)
    ytop = float(lay.y.max(initial=0.0))
    cy = MARGIN + HEADER + BOX_H / 2 + (ytop - lay.y) * (BOX_H + ROW_GAP)
    width = float(cx.max(initial=0.0)) + box_w / 2 + MARGIN
    height = float(cy.max(initial=0.0)) + BOX_H / 2 + MARGIN + 28
    return cx, cy, max(width, 480.0), height


def _clip(x0: float, y0: float, x1: float, y1: float, hw: float, hh: float
          ) -> tuple[float, float]:
    """Where the segment from (x0, y0) to the centre (x1, y1) enters that box."""
    dx, dy = x1 - x0, y1 - y0
    t = min(hw / abs(dx) if dx else np.inf, hh / abs(dy) if dy else np.inf)
    return (x1 - dx * min(t, 1.0), y1 - dy * min(t, 1.0))


def _edge_paths(src: np.ndarray, dst: np.ndarray, cx: np.ndarray, cy: np.ndarray,
                mid_y: float, box_w: float) -> list[str]:
    """One ``<path>`` per edge: straight in a band, bent at the band gap across."""
    out = []
    for s, d in zip(src.tolist(), dst.tolist()):
        x0, y0, x1, y1 = cx[s], cy[s], cx[d], cy[d]
        if (y0 < mid_y) != (y1 < mid_y):  # across the bands: via the gap
            mx = (x0 + x1) / 2
            ex, ey = _clip(mx, mid_y, x1, y1, box_w / 2, BOX_H / 2)
            sx, sy = _clip(mx, mid_y, x0, y0, box_w / 2, BOX_H / 2)
            pts = f"M{sx:.1f},{sy:.1f} L{mx:.1f},{mid_y:.1f} L{ex:.1f},{ey:.1f}"
        else:
            sx, sy = _clip(x1, y1, x0, y0, box_w / 2, BOX_H / 2)
            ex, ey = _clip(x0, y0, x1, y1, box_w / 2, BOX_H / 2)
            pts = f"M{sx:.1f},{sy:.1f} L{ex:.1f},{ey:.1f}"
        out.append(f'<path class="edge" d="{pts}" marker-end="url(#arrow)"/>')
    return out


def _box(i: int, info: dict[str, Any], name: str, x: float, y: float, box_w: float) -> str:
    phase = info.get("phase", "forward")
    line1, line2 = group_lines(info) if is_group(info) else node_lines(info, name)
    tip = escape(f"{name}: {info['count']} nodes" if is_group(info) else f"{name}: {line2}")
    return (f'<g class="group" data-name={quoteattr(name)}><title>{tip}</title>'
            f'<rect x="{x - box_w / 2:.1f}" y="{y - BOX_H / 2:.1f}" width="{box_w:.1f}" '
            f'height="{BOX_H:.0f}" rx="5" fill="{PHASE_FILL.get(phase, "#eeeeee")}" '
            f'stroke="{PHASE_STROKE.get(phase, "#777777")}" stroke-width="1.2"/>'
            f'<text class="label" x="{x:.1f}" y="{y - 3:.1f}" text-anchor="middle" '
            f'font-size="12" font-weight="bold">{escape(line1)}</text>'
            f'<text class="sub" x="{x:.1f}" y="{y + 12:.1f}" text-anchor="middle" '
            f'font-size="10" fill="#444">{escape(line2)}</text></g>')


def dag_svg(data: Any, lay: Any, title: str) -> str:
    """The SVG document of a (collapsed) DAG.

    Args:
        data: :class:`jointlab.viz.dag.DagData` (groups when collapsed).
        lay: Its :class:`jointlab.viz._layout.Layout`.
        title: The heading line.

    Returns:
        The SVG text; one ``<g class="group">`` per node or group, one
        ``<path class="edge">`` per edge.
    """
    lines = [group_lines(i) if is_group(i) else node_lines(i, n)
             for i, n in zip(data.info, data.names)]
    widest = max((max(len(a), len(b)) for a, b in lines), default=8)
    box_w = max(96.0, widest * CHAR_W + 16)
    cx, cy, width, height = _pixels(lay, box_w)
    fwd = [cy[i] for i, b in enumerate(data.is_bwd) if not b]
    bwd = [cy[i] for i, b in enumerate(data.is_bwd) if b]
    mid_y = ((max(fwd) + min(bwd)) / 2) if fwd and bwd else height
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="{FONT}">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#8a8a9a"/></marker></defs>',
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="white"/>',
        f'<text class="title" x="{MARGIN}" y="{MARGIN + 8}" font-size="15" '
        f'font-weight="bold">{escape(title)}</text>',
        f'<text x="{MARGIN}" y="{MARGIN + 28}" font-size="11" fill="#1f77b4">forward →'
        f'</text>',
    ]
    if bwd:
        parts.append(f'<line x1="0" x2="{width:.0f}" y1="{mid_y:.1f}" y2="{mid_y:.1f}" '
                     'stroke="#bbb" stroke-dasharray="4 4"/>')
        parts.append(f'<text x="{MARGIN}" y="{height - MARGIN:.0f}" font-size="11" '
                     'fill="#d62728">← backward</text>')
    parts.append('<g fill="none" stroke="#8a8a9a" stroke-width="1.1">')
    parts += _edge_paths(data.src, data.dst, cx, cy, mid_y, box_w)
    parts.append("</g>")
    parts += [_box(i, m, data.names[i], cx[i], cy[i], box_w) for i, m in enumerate(data.info)]
    parts.append("</svg>")
    return "\n".join(parts)
