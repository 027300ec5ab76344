"""SVG text of a simple plotly figure: line/area scatters (stacked too) and horizontal bars.

Covers what :func:`jointlab.plot_memory` and :func:`jointlab.plot_lifetimes`
draw: ``scatter`` lines, stack groups, markers with text, ``bar`` with
``orientation="h"`` and ``base`` over categories, vertical line shapes with
their annotation, a data-anchored annotation (the peak label, on the side its
``xanchor`` names, kept inside the plot), axis titles, a legend under the plot
(never over it). Traces with ``visible="legendonly"`` or ``False`` are left
out, as plotly leaves them out of the plot. Any other trace type is refused
rather than drawn wrong. The figure is read as plotly's figure dict
(``{"data": [...], "layout": {...}}``: a plotly ``Figure`` is read through
``to_plotly_json()``), so drawing it needs no plotly. Text in a figure is
plotly's (HTML-escaped): it is unescaped, then escaped once for SVG.
"""

from __future__ import annotations

import base64
import html
import math
import re
from typing import Any
from xml.sax.saxutils import escape

import numpy as np

from jointlab.errors import ExportError

FONT = "DejaVu Sans, Verdana, Arial, sans-serif"
PAD_L, PAD_R, PAD_T = 80.0, 30.0, 50.0
_DASH = {"dot": "2 3", "dash": "6 4", "dashdot": "6 3 2 3"}
#: Width of one character of 12 px text, as an estimate for label boxes and the legend.
CHAR_W = 7.4
_FIELD = re.compile(r"%\{(customdata\[(\d+)\]|x|y|base)(?::([^}]*))?\}")


def get_path(d: Any, *path: str, default: Any = None) -> Any:
    """``d[path[0]][path[1]]...``, or ``default`` where a step is missing or None."""
    for key in path:
        if not isinstance(d, dict) or d.get(key) is None:
            return default
        d = d[key]
    return d


def _text(value: Any) -> str:
    """Plotly's (HTML) text as SVG text: unescaped, then escaped once."""
    return escape(html.unescape(str(value)))


def figure_dict(fig: Any) -> dict[str, Any]:
    """The figure dict of ``fig``: a dict as it is, a plotly figure or a PlotView read."""
    if isinstance(fig, dict):
        return fig
    spec = getattr(type(fig), "figure_dict", None)
    if callable(spec):
        return fig.figure_dict()
    return _decoded(fig.to_plotly_json())


def _decoded(v: Any) -> Any:
    """Plotly's JSON with its typed arrays (``{"dtype": "f8", "bdata": ...}``) as numpy arrays."""
    if isinstance(v, dict):
        if "bdata" in v and "dtype" in v:
            a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
            shape = v.get("shape")
            if shape:
                a = a.reshape([int(n) for n in str(shape).split(",")])
            return a
        return {k: _decoded(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_decoded(x) for x in v]
    return v


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


class Frame:
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


def _is_bar(tr: dict[str, Any]) -> bool:
    return tr.get("type") == "bar"


def _color(tr: dict[str, Any]) -> str:
    color = get_path(tr, "marker" if _is_bar(tr) else "line", "color")
    return color or "#444"


def shown_traces(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The traces plotly draws (not hidden); refuses trace types this writer cannot draw."""
    out = []
    for tr in spec.get("data", []):
        if tr.get("visible") in ("legendonly", False):
            continue
        kind = tr.get("type", "scatter")
        if kind not in ("scatter", "bar") or (kind == "bar" and tr.get("orientation") != "h"):
            raise ExportError(f"export_figure draws line/area scatters and horizontal bars; "
                              f"this figure has a {kind} trace")
        out.append(tr)
    return out


def stacked(traces: list[dict[str, Any]]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per stacked scatter: its (lower, upper) edges, stacked in trace order."""
    sums: dict[str, np.ndarray] = {}
    out = {}
    for k, tr in enumerate(traces):
        if not _is_bar(tr) and tr.get("stackgroup"):
            y = np.asarray(tr["y"], dtype=float)
            base = sums.get(tr["stackgroup"], np.zeros_like(y))
            out[k] = (base, base + y)
            sums[tr["stackgroup"]] = base + y
    return out


def _extent(layout: dict[str, Any], traces: list[dict[str, Any]], stacks: dict
            ) -> tuple[tuple, tuple, list[str]]:
    xs, ys, cats = [], [], []
    for k, tr in enumerate(traces):
        if _is_bar(tr):
            base = np.asarray(tr.get("base", 0), dtype=float)
            xs += [float(np.min(base, initial=0)), float(np.max(base + np.asarray(tr["x"])))]
            cats += [c for c in tr["y"] if c not in cats]
        else:
            xs += [float(np.min(tr["x"])), float(np.max(tr["x"]))]
            ys.append(float(np.nanmax(stacks[k][1] if k in stacks else tr["y"])))
    order = list(get_path(layout, "yaxis", "categoryarray") or cats) if cats else []
    yr = get_path(layout, "yaxis", "range")
    if order:
        y = (-0.5, len(order) - 0.5)
    else:
        y = tuple(yr) if yr else (0.0, 1.05 * max(ys, default=1.0))
    return (min(xs, default=0.0), max(xs, default=1.0)), y, order


def hover_text(tr: dict[str, Any], i: int) -> str:
    """Point ``i``'s hover text from the trace's ``hovertemplate`` (tags dropped), plain."""
    template = tr.get("hovertemplate") or ""
    custom = tr.get("customdata")

    def field(m: re.Match) -> str:
        if m.group(2) is not None:
            v = custom[i][int(m.group(2))] if custom is not None else ""
        else:
            v = np.asarray(tr.get(m.group(1), 0)).reshape(-1)[i] if m.group(1) in tr else ""
        fmt = m.group(3)
        try:
            return format(float(v), fmt) if fmt else str(v)
        except (TypeError, ValueError):
            return str(v)

    text = _FIELD.sub(field, template.split("<extra>")[0])
    text = re.sub(r"<br\s*/?>", "\n", text)
    return html.unescape(re.sub(r"<[^>]+>", "", text))


def _bars_svg(tr: dict[str, Any], f: Frame, cats: list[str]) -> list[str]:
    base = np.broadcast_to(np.asarray(tr.get("base", 0), float), (len(tr["x"]),))
    row_h = f.h / max(len(cats), 1)
    out = []
    for i, (c, b, w) in enumerate(zip(tr["y"], base, np.asarray(tr["x"], dtype=float))):
        y = f.py(cats.index(c)) - 0.4 * row_h
        x0, x1 = f.px(b), f.px(b + w)
        tip = hover_text(tr, i) if tr.get("hovertemplate") else ""
        out.append(f'<rect class="bar" x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 1):.1f}" '
                   f'height="{0.8 * row_h:.1f}" fill="{_color(tr)}">'
                   + (f"<title>{escape(tip)}</title>" if tip else "") + "</rect>")
    return out


def _trace_svg(tr: dict[str, Any], k: int, f: Frame, stacks: dict, cats: list[str]
               ) -> list[str]:
    if _is_bar(tr):
        return _bars_svg(tr, f, cats)
    color, x, out = _color(tr), f.px(tr["x"]), []
    if k in stacks:
        lo, hi = stacks[k]
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(x, f.py(hi)))
        back = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(x[::-1], f.py(lo)[::-1]))
        out.append(f'<polygon class="area" points="{pts} {back}" fill="{color}" '
                   'fill-opacity="0.55" stroke="none"/>')
        y = f.py(hi)
    else:
        y = f.py(tr["y"])
    mode = tr.get("mode") or "lines"
    if "lines" in mode:
        dash = _DASH.get(get_path(tr, "line", "dash", default=""), "")
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(x, y) if np.isfinite(b))
        out.append(f'<polyline class="line" points="{pts}" fill="none" stroke="{color}" '
                   f'stroke-width="{get_path(tr, "line", "width", default=1.5)}"'
                   + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
    if "markers" in mode:
        mc = get_path(tr, "marker", "color") or color
        out += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="4" fill="{mc}"/>' for a, b in zip(x, y)]
    if "text" in mode and tr.get("text") is not None:
        texts = [tr["text"]] if isinstance(tr["text"], str) else list(tr["text"])
        for a, b, t in zip(x, y, texts):
            anchor = "end" if a > f.left + 0.7 * f.w else "start" if a < f.left + 0.3 * f.w \
                else "middle"
            out.append(f'<text class="point-label" x="{a:.1f}" y="{b - 9:.1f}" font-size="12" '
                       f'text-anchor="{anchor}">{_text(t)}</text>')
    return out


def _axes(f: Frame, cats: list[str], labels: list[str], xtitle: str, ytitle: str) -> list[str]:
    out = [f'<rect class="plot-area" x="{f.left}" y="{f.top}" width="{f.w}" height="{f.h}" '
           f'fill="none" stroke="#999" data-x0="{f.x0}" data-x1="{f.x1}"/>']
    for t in _ticks(f.x0, f.x1):
        x = float(f.px(t))
        out.append(f'<text x="{x:.1f}" y="{f.top + f.h + 16:.1f}" font-size="12" '
                   f'text-anchor="middle">{_fmt(t)}</text>')
    ylabels = list(enumerate(labels)) if cats else [(t, _fmt(t)) for t in _ticks(f.y0, f.y1)]
    for t, label in ylabels:
        y = float(f.py(t))
        out.append(f'<line x1="{f.left}" x2="{f.left + f.w}" y1="{y:.1f}" y2="{y:.1f}" '
                   'stroke="#eee"/>')
        out.append(f'<text class="ytick" x="{f.left - 6:.1f}" y="{y + 3.5:.1f}" '
                   f'font-size="12" text-anchor="end">{_text(label)}</text>')
    out.append(f'<text x="{f.left + f.w / 2:.1f}" y="{f.top + f.h + 34:.1f}" font-size="13" '
               f'text-anchor="middle">{_text(xtitle)}</text>')
    if ytitle:
        cy = f.top + f.h / 2
        out.append(f'<text x="16" y="{cy:.1f}" font-size="13" text-anchor="middle" '
                   f'transform="rotate(-90 16 {cy:.1f})">{_text(ytitle)}</text>')
    return out


def _vlines(layout: dict[str, Any], f: Frame) -> list[str]:
    out = []
    for s in layout.get("shapes") or ():
        if s.get("type") == "line" and s.get("x0") == s.get("x1") \
                and s.get("xref") in ("x", None):
            x = float(f.px(s["x0"]))
            out.append(f'<line class="vline" x1="{x:.1f}" x2="{x:.1f}" y1="{f.top}" '
                       f'y2="{f.top + f.h}" stroke="gray" stroke-dasharray="6 4"/>')
    for a in layout.get("annotations") or ():
        if a.get("xref") in ("x", None) and a.get("x") is not None and a.get("text"):
            out.append(_annotation_svg(a, f))
    return out


def _annotation_svg(a: dict[str, Any], f: Frame) -> str:
    """A data-anchored annotation (the peak) beside its point; a paper one above the plot."""
    x = float(f.px(a["x"]))
    if a.get("yref") in ("y", None) and a.get("y") is not None:
        return _point_label(a, x, float(f.py(a["y"])), f)
    return (f'<text class="annotation" x="{x:.1f}" y="{f.top - 6:.1f}" font-size="12" '
            f'text-anchor="middle" fill="#555">{_text(a["text"])}</text>')


def _point_label(a: dict[str, Any], x: float, y: float, f: Frame) -> str:
    """The label in a white box at (ax, ay) from its point, on its ``xanchor`` side, in the plot."""
    raw = html.unescape(str(a["text"]))
    w, h = CHAR_W * len(raw) + 8, 20.0
    ax, ay = float(a.get("ax", 0) or 0), float(a.get("ay", -12) or -12)
    side = a.get("xanchor") or "center"
    bx = x + ax - (0 if side == "left" else w if side == "right" else w / 2)
    bx = min(max(bx, f.left + 2), f.left + f.w - w - 2)
    by = min(max(y + ay - h / 2, f.top + 2), f.top + f.h - h - 2)
    return (f'<g class="peak-label"><line x1="{x:.1f}" y1="{y:.1f}" x2="{bx + w / 2:.1f}" '
            f'y2="{by + h:.1f}" stroke="#888"/><rect x="{bx:.1f}" y="{by:.1f}" width="{w:.1f}" '
            f'height="{h:.0f}" fill="white" stroke="#888"/><text class="point-label" '
            f'x="{bx + 4:.1f}" y="{by + 14.5:.1f}" font-size="12">{escape(raw)}</text></g>')


def _legend(traces: list[dict[str, Any]], y: float, width: float) -> list[str]:
    out, x = [], PAD_L
    for tr in traces:
        if tr.get("showlegend") is False or not tr.get("name"):
            continue
        name = html.unescape(str(tr["name"]))
        step = 30 + CHAR_W * len(name)
        if x + step > width - PAD_R:
            x, y = PAD_L, y + 18
        out.append(f'<g class="legend-item"><rect x="{x:.1f}" y="{y - 9:.1f}" width="14" '
                   f'height="10" fill="{_color(tr)}"/><text class="legend" x="{x + 19:.1f}" '
                   f'y="{y:.1f}" font-size="12">{escape(name)}</text></g>')
        x += step
    return out


def _title_lines(head: str, width: float) -> list[str]:
    """The title on one line, or split after its first clause when too wide for ``width``."""
    if 8.6 * len(head) <= width - PAD_L - PAD_R or " — " not in head:
        return [head]
    first, rest = head.split(" — ", 1)
    return [first, rest]


def figure_svg(fig: Any, *, title: str | None = None, width: int = 960) -> str:
    """The SVG document of a line/area/bar plotly figure.

    Args:
        fig: A figure dict, a plotly figure, or a :func:`jointlab.plot_memory` /
            :func:`jointlab.plot_lifetimes` view.
        title: Heading; the figure's title by default.
        width: Canvas width in pixels.

    Returns:
        The SVG text.

    Raises:
        ExportError: The figure has a trace type this writer does not draw.
    """
    spec = figure_dict(fig)
    layout = spec.get("layout") or {}
    traces = shown_traces(spec)
    stacks = stacked(traces)
    xr, yr, cats = _extent(layout, traces, stacks)
    labels = cats
    vals, text = get_path(layout, "yaxis", "tickvals"), get_path(layout, "yaxis", "ticktext")
    if cats and vals is not None and text is not None:
        named = dict(zip(vals, text))
        labels = [named.get(c, c) for c in cats]
    height = float(layout.get("height") or 460)
    longest = max((len(html.unescape(str(s))) for s in labels), default=0)
    left = PAD_L + (CHAR_W * longest if cats else 0)
    head = title if title is not None else str(get_path(layout, "title", "text", default=""))
    heads = _title_lines(html.unescape(head), width)
    top = PAD_T + 18 * (len(heads) - 1)
    f = Frame(xr, yr, (left, top, width - left - PAD_R, height - top - 110))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0f}" '
             f'viewBox="0 0 {width} {height:.0f}" font-family="{FONT}">',
             f'<rect width="{width}" height="{height:.0f}" fill="white"/>']
    parts += [f'<text class="title" x="{PAD_L}" y="{26 + 18 * k}" font-size="{15 - k}" '
              f'font-weight="{"bold" if k == 0 else "normal"}">{escape(line)}</text>'
              for k, line in enumerate(heads)]
    parts += _axes(f, cats, labels, str(get_path(layout, "xaxis", "title", "text", default="")),
                   str(get_path(layout, "yaxis", "title", "text", default="")))
    for k, tr in enumerate(traces):
        parts += _trace_svg(tr, k, f, stacks, cats)
    parts += _vlines(layout, f)
    parts += _legend(traces, f.top + f.h + 62, width)
    parts.append("</svg>")
    return "\n".join(parts)
