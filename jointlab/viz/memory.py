"""Plotly figures of a :class:`jointlab.MemoryProfile`.

- :func:`plot_memory`: live bytes by category over node steps (stacked), the
  forward/backward boundary, the peak, and measured lines when measured.
- :func:`plot_lifetimes`: a Gantt chart of the largest storages.

Long graphs are downsampled to at most ``max_points`` steps, keeping in every
bucket the step with the largest total so that no peak is lost.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from jointlab.analysis.memory.result import CATEGORIES

COLORS = {
    "param": "#4c78a8", "buffer": "#9ecae9", "input": "#72b7b2", "activation": "#f58518",
    "temporary": "#bab0ac", "gradient": "#54a24b", "output": "#b279a2",
}
_HOVER_COLS = ["node", "module", "op", "shape"]


def _escaped(df: pd.DataFrame) -> pd.DataFrame:
    """Model-derived strings as HTML-escaped text (hover labels render HTML)."""
    return df.astype(str).apply(lambda col: col.map(html.escape))


def _unit(peak: float) -> tuple[float, str]:
    for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if peak >= 2 * scale:
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


def plot_memory(profile: Any, *, max_points: int = 4000, measured: bool = True) -> go.Figure:
    """Stacked live bytes by category over node steps.

    Args:
        profile: A :class:`jointlab.MemoryProfile`.
        max_points: Downsample longer timelines to this many steps.
        measured: Overlay the measured lines when the profile has them.

    Returns:
        A plotly figure.
    """
    full = profile.timeline
    tl = downsample(full, max_points)
    peak = max(profile.peak_bytes, profile.measured_total_peak_bytes or 0)
    scale, unit = _unit(peak)
    x = tl.index.to_numpy()
    custom = _escaped(tl[_HOVER_COLS]).to_numpy()
    fig = go.Figure()
    for c in CATEGORIES:
        if not full[c].any():
            continue
        fig.add_trace(go.Scatter(
            x=x, y=tl[c] / scale, name=c, stackgroup="pred", mode="lines",
            line={"width": 0.5, "color": COLORS[c]}, customdata=custom,
            hovertemplate=f"{c}: %{{y:.3f}} {unit}<extra></extra>"))
    fig.add_trace(go.Scatter(
        x=x, y=tl["total"] / scale, name="predicted total", mode="lines",
        line={"color": "black", "width": 1.2}, customdata=custom,
        hovertemplate=("step %{x}: <b>%{customdata[0]}</b><br>module %{customdata[1]}"
                       "<br>op %{customdata[2]}<br>shape %{customdata[3]}"
                       f"<br>predicted %{{y:.3f}} {unit}<extra></extra>")))
    if measured and "measured" in tl:
        fig.add_trace(go.Scatter(
            x=x, y=tl["measured"] / scale, name="measured (graph values)", mode="lines",
            line={"color": "crimson", "width": 1.5, "dash": "dot"},
            hovertemplate=f"measured %{{y:.3f}} {unit}<extra></extra>"))
        if tl["workspace"].any():
            fig.add_trace(go.Scatter(
                x=x, y=tl["measured_total"] / scale, name="measured + kernel workspace",
                mode="lines", line={"color": "orange", "width": 1, "dash": "dash"},
                hovertemplate=f"with workspace %{{y:.3f}} {unit}<extra></extra>"))
    _mark_boundary(fig, profile.boundary_step, len(full))
    pk = int(full["total"].to_numpy().argmax())
    fig.add_trace(go.Scatter(
        x=[pk], y=[profile.peak_bytes / scale], mode="markers+text", name="peak",
        marker={"color": "black", "size": 9, "symbol": "triangle-down"},
        text=[f"peak {profile.peak_bytes / scale:.2f} {unit} at {profile.peak_node}"],
        textposition=_label_side(pk, len(full)), hoverinfo="skip", showlegend=False))
    title = "Memory per node step"
    if profile.measured:
        title += (f" — predicted peak {profile.peak_bytes / scale:.2f} {unit}, measured "
                  f"{profile.measured_peak_bytes / scale:.2f} {unit} "
                  f"({100 * profile.peak_error:+.2f}%)")
    fig.update_layout(title=title, xaxis_title="node step", yaxis_title=f"live {unit}",
                      hovermode="x", template="plotly_white",
                      yaxis={"range": [0, 1.12 * peak / scale]},
                      legend={"orientation": "h", "y": -0.25})
    return fig


def _label_side(x: int, n: int) -> str:
    """Keep the peak label inside the plot near either edge."""
    if x > 0.7 * n:
        return "top left"
    return "top right" if x < 0.3 * n else "top center"


def _mark_boundary(fig: go.Figure, boundary: int, n: int) -> None:
    if 0 < boundary < n:
        fig.add_vline(x=boundary - 0.5, line={"color": "gray", "dash": "dash"},
                      annotation_text="forward | backward", annotation_position="bottom left")


def plot_lifetimes(profile: Any, top: int = 50, *, include_state: bool = False) -> go.Figure:
    """Gantt chart of the ``top`` largest storages, from birth to death step.

    Args:
        profile: A :class:`jointlab.MemoryProfile`.
        top: How many storages to show.
        include_state: Also show parameters, buffers and inputs (alive throughout).

    Returns:
        A plotly figure.
    """
    life = profile.lifetimes
    if not include_state:
        life = life[~life["category"].isin(["param", "buffer", "input"])]
    life = life.nlargest(top, "bytes", keep="first").sort_values("first_step", ascending=False)
    scale, unit = _unit(float(life["bytes"].max()) if len(life) else 0.0)
    fig = go.Figure()
    for c in CATEGORIES:
        sub = life[life["category"] == c]
        if sub.empty:
            continue
        text = _escaped(sub[["op", "module", "shape"]])
        custom = np.stack([text["op"], text["module"], text["shape"], sub["bytes"] / scale,
                           sub["first_step"], sub["last_step"]], axis=1)
        fig.add_trace(go.Bar(
            y=sub["storage"], x=sub["last_step"] - sub["first_step"] + 1,
            base=sub["first_step"], orientation="h", name=c,
            marker={"color": COLORS[c]}, customdata=custom,
            hovertemplate=("<b>%{y}</b> %{customdata[0]}<br>module %{customdata[1]}"
                           "<br>shape %{customdata[2]}<br>%{customdata[3]:.2f} " + unit +
                           "<br>steps %{customdata[4]}–%{customdata[5]}<extra></extra>")))
    _mark_boundary(fig, profile.boundary_step, len(profile.timeline))
    fig.update_layout(
        title=f"Lifetimes of the {len(life)} largest storages", barmode="overlay",
        xaxis_title="node step", template="plotly_white",
        yaxis={"categoryorder": "array", "categoryarray": list(life["storage"]),
               "tickfont": {"size": 9}},
        height=max(350, 16 * len(life) + 120), legend={"orientation": "h", "y": -0.12})
    return fig
