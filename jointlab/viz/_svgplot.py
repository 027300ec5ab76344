"""SVG text of a simple plotly figure: line/area scatters (stacked too) and horizontal bars.

Covers what :func:`jointlab.plot_memory` and :func:`jointlab.plot_lifetimes`
draw: ``go.Scatter`` lines, stack groups, markers with text, ``go.Bar`` with
``orientation="h"`` and ``base`` over categories, vertical line shapes with
their annotation, axis titles, a legend. Traces with ``visible="legendonly"``
or ``False`` are left out, as plotly leaves them out of the plot. Any other
trace type is refused rather than drawn wrong.
"""

from __future__ import annotations

import math
from typing import Any
from xml.sax.saxutils import escape

import numpy as np

from jointlab.errors import ExportError

FONT = "DejaVu Sans, Verdana, Arial, sans-serif"
PAD_L, PAD_R, PAD_T = 80.0, 30.0, 50.0
_DASH = {"dot": "2 3", "dash": "6 4", "dashdot": "6 3 2 3"}


def _ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + k * step for k in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v - round(v)) < 1e-9 else f"{v:.3g}"


class _Frame:
    """Maps data coordinates to pixels inside the plot area."""

    def __init__(self, x: tuple[float, float], y: tuple[float, float], box: tuple[float, ...]):
        self.x0, self.x1 = x
        self.y0, self.y1 = y
        self.left, self.top, self.w, self.h = box

    def px(self, x: Any) -> np.ndarray:
        span = (self.x1 - self.x0) or 1.0
        return self.left + (np.asarray(x, dtype=float) - self.x0) / span * self.w

    def py(self, y: Any) -> np.ndarray:
        span = (self.y1 - self.y0) or 1.0
        return self.top + self.h - (np.asarray(y, dtype=float) - self.y0) / span * self.h


def _shown(fig: Any) -> list[Any]:
    out = []
    for tr in fig.data:
        if tr.visible in ("legendonly", False):
            continue
        if tr.type not in ("scatter", "bar") or (tr.type == "bar" and tr.orientation != "h"):
            raise ExportError(f"export_figure draws line/area scatters and horizontal bars; "
                              f"this figure has a {tr.type} trace")
        out.append(tr)
    return out


def _stacked(traces: list[Any]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per stacked scatter: its (lower, upper) edges, stacked in trace order."""
    sums: dict[str, np.ndarray] = {}
    out = {}
    for k, tr in enumerate(traces):
        if tr.type == "scatter" and tr.stackgroup:
            y = np.asarray(tr.y, dtype=float)
            base = sums.get(tr.stackgroup, np.zeros_like(y))
            out[k] = (base, base + y)
            sums[tr.stackgroup] = base + y
    return out


def _extent(fig: Any, traces: list[Any], stacks: dict) -> tuple[tuple, tuple, list[str]]:
    xs, ys, cats = [], [], []
    for k, tr in enumerate(traces):
        if tr.type == "bar":
            base = np.asarray(tr.base if tr.base is not None else 0, dtype=float)
            xs += [float(np.min(base, initial=0)), float(np.max(base + np.asarray(tr.x)))]
            cats += [c for c in tr.y if c not in cats]
        else:
            xs += [float(np.min(tr.x)), float(np.max(tr.x))]
            ys.append(float(np.nanmax(stacks[k][1] if k in stacks else tr.y)))
    order = list(fig.layout.yaxis.categoryarray or cats) if cats else []
    yr = fig.layout.yaxis.range
    if order:
        y = (-0.5, len(order) - 0.5)
    else:
        y = tuple(yr) if yr else (0.0, 1.05 * max(ys, default=1.0))
    return (min(xs, default=0.0), max(xs, default=1.0)), y, order


def _trace_svg(tr: Any, k: int, f: _Frame, stacks: dict, cats: list[str]) -> list[str]:
    color = (tr.line.color if tr.type == "scatter" else tr.marker.color) or "#444"
    if tr.type == "bar":
        base = np.broadcast_to(np.asarray(tr.base if tr.base is not None else 0, float),
                               (len(tr.x),))
        row_h = f.h / max(len(cats), 1)
        out = []
        for c, b, w in zip(tr.y, base, np.asarray(tr.x, dtype=float)):
            y = f.py(cats.index(c)) - 0.4 * row_h
            x0, x1 = f.px(b), f.px(b + w)
            out.append(f'<rect class="bar" x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 1):.1f}" '
                       f'height="{0.8 * row_h:.1f}" fill="{color}"/>')
        return out
    x = f.px(tr.x)
    out = []
    if k in stacks:
        lo, hi = stacks[k]
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(x, f.py(hi)))
        back = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(x[::-1], f.py(lo)[::-1]))
        out.append(f'<polygon class="area" points="{pts} {back}" fill="{color}" '
                   'fill-opacity="0.55" stroke="none"/>')
        y = f.py(hi)
    else:
        y = f.py(tr.y)
    mode = tr.mode or "lines"
    if "lines" in mode:
        dash = _DASH.get(tr.line.dash or "", "")
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(x, y) if np.isfinite(b))
        out.append(f'<polyline class="line" points="{pts}" fill="none" stroke="{color}" '
                   f'stroke-width="{tr.line.width or 1.5}"'
                   + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
    if "markers" in mode:
        mc = tr.marker.color or color
        out += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="4" fill="{mc}"/>' for a, b in zip(x, y)]
    if "text" in mode and tr.text is not None:
        texts = [tr.text] if isinstance(tr.text, str) else list(tr.text)
        for a, b, t in zip(x, y, texts):
            anchor = "end" if a > f.left + 0.7 * f.w else "start" if a < f.left + 0.3 * f.w \
                else "middle"
            out.append(f'<text class="point-label" x="{a:.1f}" y="{b - 9:.1f}" font-size="11" '
                       f'text-anchor="{anchor}">{escape(str(t))}</text>')
    return out


def _axes(f: _Frame, cats: list[str], xtitle: str, ytitle: str) -> list[str]:
    out = [f'<rect x="{f.left}" y="{f.top}" width="{f.w}" height="{f.h}" fill="none" '
           'stroke="#999"/>']
    for t in _ticks(f.x0, f.x1):
        x = float(f.px(t))
        out.append(f'<text x="{x:.1f}" y="{f.top + f.h + 16:.1f}" font-size="11" '
                   f'text-anchor="middle">{_fmt(t)}</text>')
    ylabels = list(enumerate(cats)) if cats else [(t, _fmt(t)) for t in _ticks(f.y0, f.y1)]
    size = 9 if cats else 11
    for t, label in ylabels:
        y = float(f.py(t))
        out.append(f'<line x1="{f.left}" x2="{f.left + f.w}" y1="{y:.1f}" y2="{y:.1f}" '
                   'stroke="#eee"/>')
        out.append(f'<text x="{f.left - 6:.1f}" y="{y + 3.5:.1f}" font-size="{size}" '
                   f'text-anchor="end">{escape(str(label))}</text>')
    out.append(f'<text x="{f.left + f.w / 2:.1f}" y="{f.top + f.h + 34:.1f}" font-size="12" '
               f'text-anchor="middle">{escape(xtitle)}</text>')
    if ytitle:
        cy = f.top + f.h / 2
        out.append(f'<text x="16" y="{cy:.1f}" font-size="12" text-anchor="middle" '
                   f'transform="rotate(-90 16 {cy:.1f})">{escape(ytitle)}</text>')
    return out


def _vlines(fig: Any, f: _Frame) -> list[str]:
    out = []
    for s in fig.layout.shapes:
        if s.type == "line" and s.x0 == s.x1 and s.xref in ("x", None):
            x = float(f.px(s.x0))
            out.append(f'<line class="vline" x1="{x:.1f}" x2="{x:.1f}" y1="{f.top}" '
                       f'y2="{f.top + f.h}" stroke="gray" stroke-dasharray="6 4"/>')
    for a in fig.layout.annotations:
        if a.xref in ("x", None) and a.x is not None and a.text:
            out.append(_annotation_svg(a, f))
    return out


def _annotation_svg(a: Any, f: _Frame) -> str:
    """A data-anchored annotation (the peak) at its point; a paper one above the plot."""
    x = float(f.px(a.x))
    if a.yref in ("y", None) and a.y is not None:
        y = float(f.py(a.y))
        return (f'<text class="point-label" x="{x:.1f}" y="{y - 12:.1f}" font-size="11" '
                f'text-anchor="middle">{escape(a.text)}</text>')
    return (f'<text class="annotation" x="{x:.1f}" y="{f.top - 6:.1f}" font-size="11" '
            f'text-anchor="middle" fill="#555">{escape(a.text)}</text>')


def _legend(traces: list[Any], y: float, width: float) -> list[str]:
    out, x = [], PAD_L
    for tr in traces:
        if tr.showlegend is False or not tr.name:
            continue
        color = (tr.line.color if tr.type == "scatter" else tr.marker.color) or "#444"
        label = escape(tr.name)
        step = 30 + 6.8 * len(tr.name)
        if x + step > width - PAD_R:
            x, y = PAD_L, y + 18
        out.append(f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="14" height="10" fill="{color}"/>'
                   f'<text class="legend" x="{x + 19:.1f}" y="{y:.1f}" font-size="11">{label}'
                   "</text>")
        x += step
    return out


def figure_svg(fig: Any, *, title: str | None = None, width: int = 960) -> str:
    """The SVG document of a line/area/bar plotly figure.

    Args:
        fig: A plotly figure (``plot_memory``, ``plot_lifetimes``).
        title: Heading; the figure's title by default.
        width: Canvas width in pixels.

    Returns:
        The SVG text.

    Raises:
        ExportError: The figure has a trace type this writer does not draw.
    """
    traces = _shown(fig)
    stacks = _stacked(traces)
    xr, yr, cats = _extent(fig, traces, stacks)
    height = float(fig.layout.height or 460)
    left = PAD_L + (7.0 * max(map(len, map(str, cats)), default=0) if cats else 0)
    f = _Frame(xr, yr, (left, PAD_T, width - left - PAD_R, height - PAD_T - 110))
    head = title if title is not None else str(fig.layout.title.text or "")
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0f}" '
             f'viewBox="0 0 {width} {height:.0f}" font-family="{FONT}">',
             f'<rect width="{width}" height="{height:.0f}" fill="white"/>',
             f'<text class="title" x="{PAD_L}" y="28" font-size="14" font-weight="bold">'
             f"{escape(head)}</text>"]
    parts += _axes(f, cats, str(fig.layout.xaxis.title.text or ""),
                   str(fig.layout.yaxis.title.text or ""))
    for k, tr in enumerate(traces):
        parts += _trace_svg(tr, k, f, stacks, cats)
    parts += _vlines(fig, f)
    parts += _legend(traces, f.top + f.h + 62, width)
    parts.append("</svg>")
    return "\n".join(parts)
