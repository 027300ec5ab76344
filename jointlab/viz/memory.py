"""Figures of a :class:`jointlab.MemoryProfile`.

- :func:`plot_memory`: live bytes by category over node steps (stacked), the
  forward/backward boundary, the peak, and measured lines when measured.
- :func:`plot_lifetimes`: a Gantt chart of the largest storages.

Each figure is built as a plotly figure dict without importing plotly, and shown
in a notebook as inline SVG (:class:`jointlab.viz._figview.PlotView`): plotly's
display path (its validators, ``nbformat``/``jsonschema``, plotly.js in the page)
cost a fresh kernel seconds. The plotly figure itself is built on first use.

Long graphs are downsampled to at most ``max_points`` steps, keeping in every
bucket the step with the largest total so that no peak is lost.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import pandas as pd

from jointlab.analysis.memory.result import CATEGORIES
from jointlab.meta import module_label
from jointlab.viz._figview import PlotView

COLORS = {
    "param": "#4c78a8", "buffer": "#9ecae9", "input": "#72b7b2", "activation": "#f58518",
    "temporary": "#bab0ac", "gradient": "#54a24b", "output": "#b279a2",
}
_HOVER_COLS = ["node", "module", "op", "shape"]


def _escaped(df: pd.DataFrame) -> pd.DataFrame:
    """Model-derived strings as HTML-escaped text (hover labels render HTML)."""
    return df.astype(str).apply(lambda col: col.map(html.escape))


def _unit(peak: float) -> tuple[float, str]:
    """The binary unit the peak reads in: the one human_bytes (the cards) uses."""
    for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if peak >= scale:
            return float(scale), name
    return 1.0, "B"


def downsample(tl: pd.DataFrame, max_points: int) -> pd.DataFrame:
    """Keep at most ``max_points`` rows: the row with the largest total per bucket.

    Args:
        tl: A timeline with a ``total`` column.
        max_points: Most rows to keep.

    Returns:
        A subset of ``tl`` in step order (the global peak always kept).
    """
    n = len(tl)
    if n <= max_points:
        return tl
    key = tl["total"].to_numpy()
    if "measured" in tl:
        key = np.maximum(key, tl["measured"].to_numpy())
    bucket = np.arange(n) * max_points // n
    order = np.lexsort((-key, bucket))
    first = np.ones(n, dtype=bool)
    first[1:] = bucket[order][1:] != bucket[order][:-1]
    return tl.iloc[np.sort(order[first])]


def _stack_traces(tl: pd.DataFrame, full: pd.DataFrame, scale: float, unit: str
                  ) -> list[dict[str, Any]]:
    """The stacked category areas and the predicted total, as plotly trace dicts."""
    x = tl.index.to_numpy()
    custom = _escaped(tl[_HOVER_COLS]).to_numpy()
    out = [{"type": "scatter", "x": x, "y": (tl[c] / scale).to_numpy(), "name": c,
            "stackgroup": "pred", "mode": "lines", "line": {"width": 0.5, "color": COLORS[c]},
            "customdata": custom, "hovertemplate": f"{c}: %{{y:.3f}} {unit}<extra></extra>"}
           for c in CATEGORIES if full[c].any()]
    out.append({"type": "scatter", "x": x, "y": (tl["total"] / scale).to_numpy(),
                "name": "predicted total", "mode": "lines",
                "line": {"color": "black", "width": 1.2}, "customdata": custom,
                "hovertemplate": ("step %{x}: <b>%{customdata[0]}</b><br>module "
                                  "%{customdata[1]}<br>op %{customdata[2]}<br>shape "
                                  f"%{{customdata[3]}}<br>predicted %{{y:.3f}} {unit}"
                                  "<extra></extra>")})
    return out


def _measured_traces(tl: pd.DataFrame, scale: float, unit: str) -> list[dict[str, Any]]:
    """The measured lines (graph values; with kernel workspace when there is any)."""
    x = tl.index.to_numpy()
    out = [{"type": "scatter", "x": x, "y": (tl["measured"] / scale).to_numpy(),
            "name": "measured (graph values)", "mode": "lines",
            "line": {"color": "crimson", "width": 1.5, "dash": "dot"},
            "hovertemplate": f"measured %{{y:.3f}} {unit}<extra></extra>"}]
    if tl["workspace"].any():
        out.append({"type": "scatter", "x": x, "y": (tl["measured_total"] / scale).to_numpy(),
                    "name": "measured + kernel workspace", "mode": "lines",
                    "line": {"color": "orange", "width": 1, "dash": "dash"},
                    "hovertemplate": f"with workspace %{{y:.3f}} {unit}<extra></extra>"})
    return out


def memory_spec(profile: Any, *, max_points: int = 4000, measured: bool = True
                ) -> dict[str, Any]:
    """The memory plot as a plotly figure dict (``{"data": [...], "layout": {...}}``).

    Plain data: building it imports no plotly. Text that plotly renders as HTML
    (hover labels, annotations) is HTML-escaped.

    Args:
        profile: A :class:`jointlab.MemoryProfile`.
        max_points: Downsample longer timelines to this many steps.
        measured: Overlay the measured lines when the profile has them.

    Returns:
        The figure dict.
    """
    full = profile.timeline
    tl = downsample(full, max_points)
    peak = max(profile.peak_bytes, profile.measured_total_peak_bytes or 0)
    scale, unit = _unit(peak)
    data = _stack_traces(tl, full, scale, unit)
    if measured and "measured" in tl:
        data += _measured_traces(tl, scale, unit)
    layout: dict[str, Any] = {"shapes": [], "annotations": []}
    _mark_boundary(layout, profile.boundary_step, len(full))
    pk = int(full["total"].to_numpy().argmax())
    data.append(_mark_peak(layout, pk, profile.peak_bytes / scale,
                           f"peak {profile.peak_bytes / scale:.2f} {unit} at "
                           f"{html.escape(profile.peak_node)}", profile.boundary_step, len(full)))
    title = "Memory per node step"
    if profile.measured:
        title += (f" — predicted peak {profile.peak_bytes / scale:.2f} {unit}, measured "
                  f"{profile.measured_peak_bytes / scale:.2f} {unit} "
                  f"({100 * profile.peak_error:+.2f}%)")
    layout.update(title={"text": title}, xaxis={"title": {"text": "node step"}},
                  yaxis={"title": {"text": f"live {unit}"}, "range": [0, _HEADROOM * peak / scale]},
                  hovermode="x", template="plotly_white", height=480,
                  margin={"t": 90, "r": 20}, legend=dict(_SIDE_LEGEND))
    return {"data": data, "layout": layout}


def plot_memory(profile: Any, *, max_points: int = 4000, measured: bool = True) -> PlotView:
    """Stacked live bytes by category over node steps.

    Shown in a notebook as inline SVG with a hover read-out (no plotly import, no
    plotly.js: the first view in a fresh kernel costs milliseconds); any plotly
    attribute (``.data``, ``.layout``, ``.update_layout``, ``.write_html``) is the
    same plotly figure's, built on first use (see :class:`jointlab.viz._figview.PlotView`).

    Args:
        profile: A :class:`jointlab.MemoryProfile`.
        max_points: Downsample longer timelines to this many steps.
        measured: Overlay the measured lines when the profile has them.

    Returns:
        The figure (``.figure`` is the ``plotly.graph_objects.Figure``).
    """
    spec = memory_spec(profile, max_points=max_points, measured=measured)
    tl = downsample(profile.timeline, max_points)
    return PlotView(spec, hover=tl[_HOVER_COLS].astype(str).to_numpy().tolist())


#: Room above the peak for its label, as a multiple of the peak.
_HEADROOM = 1.3
#: A legend to the right of the plot: it never eats the plot's height.
_SIDE_LEGEND = {"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top"}


def _mark_peak(layout: dict[str, Any], x: int, y: float, text: str, boundary: int, n: int
               ) -> dict[str, Any]:
    """The peak's label (into ``layout``), on the side away from the boundary; its marker trace."""
    right = _label_right(x, boundary, n)
    layout["annotations"].append({
        "x": x, "y": y, "text": text, "showarrow": True, "arrowhead": 0,
        "ax": 30 if right else -30, "ay": -28, "xanchor": "left" if right else "right",
        "bgcolor": "white", "bordercolor": "#888", "borderwidth": 1, "borderpad": 3,
        "font": {"size": 12}})
    return {"type": "scatter", "x": [x], "y": [y], "mode": "markers", "name": "peak",
            "hoverinfo": "skip", "showlegend": False,
            "marker": {"color": "black", "size": 9, "symbol": "triangle-down"}}


def _label_right(x: int, boundary: int, n: int) -> bool:
    """Label right of the peak when that side is away from the boundary and has room."""
    if x > 0.7 * n:
        return False
    if x < 0.3 * n:
        return True
    return x >= boundary


def _mark_boundary(layout: dict[str, Any], boundary: int, n: int) -> None:
    """The forward | backward line, labelled above the plot area (clear of every band)."""
    if 0 < boundary < n:
        layout["shapes"].append({"type": "line", "x0": boundary - 0.5, "x1": boundary - 0.5,
                                 "xref": "x", "y0": 0, "y1": 1, "yref": "y domain",
                                 "line": {"color": "gray", "dash": "dash", "width": 1}})
        layout["annotations"].append({"x": boundary - 0.5, "xref": "x", "y": 1, "yref": "paper",
                                      "yanchor": "bottom", "text": "forward ◀ | ▶ backward",
                                      "showarrow": False, "font": {"size": 12, "color": "#555"}})


def lifetime_label(module: str, op: str, filled_by: str = "") -> str:
    """A storage as a user recognises it: ``h.0.mlp.1 · gelu``, ``drop · bernoulli_``.

    Args:
        module: The owner's module FQN (``""`` is the root module).
        op: The owner's target (``aten.gelu``).
        filled_by: The in-place op that first writes an uninitialised storage.

    Returns:
        The label.
    """
    name = (filled_by or op).removeprefix("aten.")
    return f"{module_label(module)} · {name}"


def lifetimes_spec(profile: Any, top: int = 50, *, include_state: bool = False
                   ) -> dict[str, Any]:
    """The lifetime Gantt chart as a plotly figure dict (no plotly import).

    Args:
        profile: A :class:`jointlab.MemoryProfile`.
        top: How many storages to show.
        include_state: Also show parameters, buffers and inputs (alive throughout).

    Returns:
        The figure dict.
    """
    life = profile.lifetimes
    if not include_state:
        life = life[~life["category"].isin(["param", "buffer", "input"])]
    life = life.nlargest(top, "bytes", keep="first").sort_values("first_step", ascending=False)
    scale, unit = _unit(float(life["bytes"].max()) if len(life) else 0.0)
    data = []
    for c in CATEGORIES:
        sub = life[life["category"] == c]
        if sub.empty:
            continue
        text = _escaped(sub[["op", "module", "shape", "storage"]])
        custom = np.stack([text["op"], text["module"], text["shape"], sub["bytes"] / scale,
                           sub["first_step"], sub["last_step"], text["storage"]], axis=1)
        data.append({
            "type": "bar", "y": sub["storage"].to_numpy(),
            "x": (sub["last_step"] - sub["first_step"] + 1).to_numpy(),
            "base": sub["first_step"].to_numpy(), "orientation": "h", "name": c,
            "marker": {"color": COLORS[c]}, "customdata": custom,
            "hovertemplate": ("<b>%{customdata[6]}</b> %{customdata[0]}<br>module "
                              "%{customdata[1]}<br>shape %{customdata[2]}<br>"
                              "%{customdata[3]:.2f} " + unit +
                              "<br>steps %{customdata[4]}–%{customdata[5]}<extra></extra>")})
    layout: dict[str, Any] = {"shapes": [], "annotations": []}
    _mark_boundary(layout, profile.boundary_step, len(profile.timeline))
    filled = life["filled_by"] if "filled_by" in life else pd.Series("", index=life.index)
    labels = [html.escape(lifetime_label(m, o, f))
              for m, o, f in zip(life["module"], life["op"], filled)]
    layout.update(
        title={"text": f"Lifetimes of the {len(life)} largest storages"}, barmode="overlay",
        xaxis={"title": {"text": "node step"}}, template="plotly_white", margin={"t": 90},
        yaxis={"categoryorder": "array", "categoryarray": list(life["storage"]),
               "tickmode": "array", "tickvals": list(life["storage"]), "ticktext": labels,
               "tickfont": {"size": 12}, "automargin": True},
        height=max(380, 22 * len(life) + 150), legend=dict(_SIDE_LEGEND))
    return {"data": data, "layout": layout}


def plot_lifetimes(profile: Any, top: int = 50, *, include_state: bool = False) -> PlotView:
    """Gantt chart of the ``top`` largest storages, from birth to death step.

    Shown as inline SVG (each bar's tooltip names the storage, its op, module,
    shape, size and steps); plotly attributes as for :func:`plot_memory`.

    Args:
        profile: A :class:`jointlab.MemoryProfile`.
        top: How many storages to show.
        include_state: Also show parameters, buffers and inputs (alive throughout).

    Returns:
        The figure (``.figure`` is the ``plotly.graph_objects.Figure``).
    """
    return PlotView(lifetimes_spec(profile, top, include_state=include_state), width=820)
