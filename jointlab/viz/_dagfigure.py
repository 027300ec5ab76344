"""The plotly DAG figure behind ``plot_diff``'s overlays (private; not the DAG users meet).

``jl.plot_dag`` is now an alias of ``jl.dag_view`` (:mod:`jointlab.viz.dag`);
this figure stays only until the diff view draws in the ``dag_view`` engine,
then it goes. It takes its colours from :mod:`jointlab.viz._style`.

The figure is built from the node annotations (``node.meta["jointlab"]``)
and the layered layout of :mod:`jointlab.viz._layout`. Nodes are WebGL
markers, edges one WebGL line trace, so tens of thousands of nodes stay
interactive. Every string that comes from the model (op, module, source,
names) is HTML-escaped before it reaches a hover label.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import plotly.graph_objects as go

from jointlab._deprecation import renamed_kwarg
from jointlab.errors import PlotArgumentError
from jointlab.units import human_bytes, human_count
from jointlab.viz import _layout
from jointlab.viz._dagdata import (
    DagData,
    collapse,
    graph_data,
    keep_phases,
    module_prefix,
)
from jointlab.viz._style import PALETTE, PHASE_COLORS, module_colors

COLOR_BY = ("phase", "module", "category", "bytes")
MAX_LEGEND_GROUPS = 24


#: Browser config of every DAG figure: the wheel zooms, no plotly logo.
FIGURE_CONFIG = {"scrollZoom": True, "displaylogo": False}


class DagFigure(go.Figure):
    """A plotly figure that displays itself without ``plotly.io``'s renderer registry.

    ``go.Figure`` displays through ``plotly.io._renderers``, which imports
    ``nbformat`` -> ``jsonschema`` -> ``rfc3987_syntax`` (38 Lark grammars,
    8-15 s in a fresh kernel). This figure hands Jupyter its mime bundle itself,
    with :data:`FIGURE_CONFIG`: the plotly mimetype (JupyterLab's bundled plotly
    extension renders it) and ``text/html`` (the figure with plotly.js from its
    CDN), which frontends without the plotly extension render: Colab, VS Code,
    classic Notebook. Everything else is ``go.Figure``.
    """

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, **kwargs: Any
                          ) -> dict[str, Any]:
        import json

        from plotly.io._html import to_html
        from plotly.io.json import to_json_plotly

        fig = self.to_plotly_json()
        fig["config"] = dict(FIGURE_CONFIG)
        page = to_html(fig, config=dict(FIGURE_CONFIG), include_plotlyjs="cdn",
                       full_html=False, validate=False)
        return {"application/vnd.plotly.v1+json": json.loads(to_json_plotly(fig)),
                "text/html": page,
                "text/plain": f"<DagFigure: {len(self.data)} traces>"}

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self._repr_mimebundle_(), raw=True)


# -- hover ----------------------------------------------------------------------------
def node_hover(name: str, m: dict[str, Any]) -> str:
    """Hover label of one graph node; every model-derived string escaped.

    Args:
        name: The node name.
        m: Its jointlab meta.

    Returns:
        Plotly hover HTML.
    """
    e = html.escape
    shape = m.get("shape")
    lines = [f"<b>{e(str(m.get('target', '')))}</b> {e(name)}",
             f"phase: {e(str(m.get('phase', '')))}",
             f"shape: {e(str(list(shape)) if shape is not None else '-')} "
             f"{e(str(m.get('dtype', '')))}",
             f"module: {e(str(m.get('module', '')))} {e(str(m.get('module_type', '')))}",
             f"FLOPs: {human_count(m.get('flops', 0))}   bytes: {human_bytes(m.get('bytes', 0))}",
             f"source: {e(str(m.get('source', '')) or '-')}"]
    if m.get("fwd_twin"):
        lines.append(f"forward twin: {e(str(m['fwd_twin']))}")
    if m.get("grad_of"):
        lines.append(f"gradient of: {e(str(m['grad_of']))}")
    if m.get("saved_for_backward"):
        lines.append("saved for backward")
    if m.get("recompute"):
        lines.append("recomputed (checkpoint)")
    return "<br>".join(lines)


def group_hover(name: str, m: dict[str, Any]) -> str:
    """Hover label of a collapsed module group (counts and sums)."""
    e = html.escape
    ops = ", ".join(f"{e(str(op))}×{c}" for op, c in m["top_ops"])
    phases = ", ".join(f"{e(str(p))} {c}" for p, c in m["phases"].items())
    side = "backward" if m["phase"] == "backward" else "forward"
    lines = [f"<b>{e(m['module'])}</b> ({side})", f"nodes: {m['count']}  ({phases})",
             f"FLOPs: {human_count(m['flops'])}   bytes: {human_bytes(m['bytes'])}",
             f"top ops: {ops}"]
    if m.get("recompute"):
        lines.append(f"recomputed (checkpoint): {m['recompute']} nodes")
    return "<br>".join(lines)


def hover_texts(data: DagData) -> list[str]:
    """Hover label of every node in ``data``."""
    fn = group_hover if data.members else node_hover
    return [fn(n, m) for n, m in zip(data.names, data.info)]


# -- colour -----------------------------------------------------------------------------
def color_keys(data: DagData, color_by: str) -> list[str]:
    """The categorical key each node is coloured by."""
    if color_by == "phase":
        return [m.get("phase", "") for m in data.info]
    if color_by == "category":
        return [m.get("category", "") for m in data.info]
    return [module_prefix(m.get("module", ""), 2) or "(root)" for m in data.info]


def _key_colors(keys: list[str], color_by: str) -> dict[str, str]:
    uniq = list(dict.fromkeys(keys))
    if color_by == "phase":
        return {k: PHASE_COLORS.get(k, "#444444") for k in uniq}
    if color_by == "module":
        return module_colors(uniq)
    return {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(uniq)}


# -- traces -------------------------------------------------------------------------------
def _line_trace(xs: np.ndarray, ys: np.ndarray, name: str, color: str, width: float,
                dash: str = "solid", visible: bool | str = True) -> go.Scattergl:
    return go.Scattergl(x=xs, y=ys, mode="lines", name=name, hoverinfo="skip",
                        line={"color": color, "width": width, "dash": dash}, visible=visible)


#: Outline of a node that checkpointing recomputes (a group holding any): gold,
#: so it shows on the red of backward nodes and differs from the black "selected" ring.
RECOMPUTE_OUTLINE = "#e6a100"


def recompute_outline(data: DagData) -> dict[str, np.ndarray]:
    """Per-node ``marker.line`` of the DAG: a red ring on recomputed nodes."""
    rec = np.asarray([bool(m.get("recompute")) for m in data.info], dtype=bool)
    return {"color": np.where(rec, RECOMPUTE_OUTLINE, "rgba(0,0,0,0)").astype(object),
            "width": np.where(rec, 2.5, 0.0)}


def _recompute_legend() -> go.Scattergl:
    """A legend entry (no points) explaining the recompute ring."""
    return go.Scattergl(x=[None], y=[None], mode="markers", name="recomputed (checkpoint)",
                        hoverinfo="skip", marker={"size": 10, "color": "rgba(0,0,0,0)", "line": {
                            "color": RECOMPUTE_OUTLINE, "width": 2.5}})


def _node_traces(data: DagData, lay: _layout.Layout, color_by: str, size: np.ndarray
                 ) -> list[go.Scattergl]:
    text = np.asarray(hover_texts(data), dtype=object)
    names = np.asarray(data.names, dtype=object)
    common = {"mode": "markers", "hovertemplate": "%{text}<extra></extra>"}
    ring = recompute_outline(data)
    if color_by == "bytes":
        b = np.asarray([m.get("bytes", 0) for m in data.info], dtype=float)
        return [go.Scattergl(x=lay.x, y=lay.y, text=text, customdata=names, name="nodes",
                             marker={"size": size, "color": np.log10(b + 1), "line": ring,
                                     "colorscale": "Viridis", "colorbar": {"title": "log10 bytes"}},
                             **common)]
    keys = color_keys(data, color_by)
    colors = _key_colors(keys, color_by)
    if len(colors) > MAX_LEGEND_GROUPS:
        return [go.Scattergl(x=lay.x, y=lay.y, text=text, customdata=names, name=color_by,
                             marker={"size": size, "color": [colors[k] for k in keys],
                                     "line": ring}, **common)]
    karr = np.asarray(keys, dtype=object)
    traces = []
    for k, c in colors.items():
        sel = np.flatnonzero(karr == k)
        traces.append(go.Scattergl(x=lay.x[sel], y=lay.y[sel], text=text[sel],
                                   customdata=names[sel], name=k or "(none)",
                                   marker={"size": size[sel], "color": c,
                                           "line": {"color": ring["color"][sel],
                                                    "width": ring["width"][sel]}},
                                   **common))
    return traces


def _edge_subset(lay: _layout.Layout, src: np.ndarray, dst: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    return _layout.route_edges(lay.x, lay.y, src, dst)


def relation_edges(joint: Any, data: DagData) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Edges worth highlighting, as (src, dst) index arrays.

    ``saved``: forward-to-backward edges that carry a saved activation.
    ``grads``: each trainable parameter to its gradient node (not a graph edge).

    Args:
        joint: The JointGraph.
        data: Ungrouped data from :func:`graph_data`.

    Returns:
        ``{"saved": (src, dst), "grads": (src, dst)}``.
    """
    phase = np.asarray([m.get("phase", "") for m in data.info], dtype=object)
    saved = (phase[data.src] == "forward") & (phase[data.dst] == "backward")
    index = {n: i for i, n in enumerate(data.names)}
    ph = joint.params()
    pairs = [(index[ph[name].name], index[g.name]) for name, terms in joint.grad_terms().items()
             for g in terms if ph[name].name in index and g.name in index]
    gs = np.asarray([p for p, _ in pairs], dtype=np.int64)
    gd = np.asarray([g for _, g in pairs], dtype=np.int64)
    return {"saved": (data.src[saved], data.dst[saved]), "grads": (gs, gd)}


def highlight_indices(data: DagData, names: list[str]) -> np.ndarray:
    """Indices of the named nodes together with their forward/backward twins.

    Args:
        data: Figure data.
        names: Node names to highlight.

    Returns:
        Sorted unique indices.
    """
    index = {n: i for i, n in enumerate(data.names)}
    want = {index[n] for n in names if n in index}
    fwd = {data.twin[i] for i in want if data.twin[i] >= 0}
    anchor = want | fwd
    extra = {i for i, t in enumerate(data.twin) if t in anchor}
    return np.asarray(sorted(want | fwd | extra), dtype=np.int64)


def dag_figure(joint: Any, *, color_by: str = "phase", depth: int | None = None,
             highlight: str | list[str] | None = None, relations: bool = True,
             sweeps: int = 4, height: int = 560, title: str | None = None,
             group_depth: int | None = None, phases: Any = None) -> DagFigure:
    """Plot the joint graph: forward left-to-right on top, backward mirrored below.

    Args:
        joint: A :class:`jointlab.JointGraph`.
        color_by: ``"phase"``, ``"module"``, ``"category"`` or ``"bytes"``.
        depth: Collapse nodes by module FQN prefix of this many components
            (one node per module and side, with counts and sums in the hover).
        highlight: Node name(s) to ring, together with their forward/backward twins.
        relations: Draw saved-activation edges and parameter-to-gradient links
            in their own colours (ungrouped figures only).
        sweeps: Barycentre sweeps for crossing reduction.
        height: Figure height in pixels.
        title: Figure title; a summary line by default.
        group_depth: Deprecated spelling of ``depth``.
        phases: Draw only nodes of these phases (all by default); with
            ``depth``, groups are formed from the kept nodes.

    Returns:
        A :class:`DagFigure` (a ``plotly.graph_objects.Figure`` that displays
        without plotly's renderer registry); ``fig.to_html(include_plotlyjs=True)``
        is self-contained.

    Raises:
        PlotArgumentError: Unknown ``color_by``, or ``depth`` is not an int >= 0.
    """
    depth = renamed_kwarg("plot_diff", "depth", depth, "group_depth", group_depth,
                          PlotArgumentError)
    if color_by not in COLOR_BY:
        raise PlotArgumentError(f"color_by must be one of {COLOR_BY}, got {color_by!r}")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)
                              or depth < 0):
        raise PlotArgumentError(f"depth must be an int >= 0 or None, got {depth!r}")
    data = graph_data(joint)
    if phases is not None:
        data = keep_phases(data, phases)
    full = data
    if depth is not None:
        data = collapse(data, depth)
    lay = _layout.layered_layout(data.is_bwd, data.src, data.dst, data.twin, sweeps=sweeps)
    n = len(data.names)
    if data.members:
        counts = np.asarray([m["count"] for m in data.info], dtype=float)
        size = 8 + 14 * np.sqrt(counts / max(counts.max(), 1))
    else:
        size = np.full(n, 7.0 if n < 5000 else 5.0)
    to_out = np.asarray([m.get("phase") == "output" for m in data.info], dtype=bool)[data.dst]
    ex, ey = _edge_subset(lay, data.src[~to_out], data.dst[~to_out])
    ox, oy = _edge_subset(lay, data.src[to_out], data.dst[to_out])
    traces: list[Any] = [_line_trace(ex, ey, "edges", "rgba(120,120,140,0.35)", 1),
                         _line_trace(ox, oy, "→ output", "rgba(148,103,189,0.35)", 1,
                                     visible="legendonly")]
    if relations and not data.members:
        rel = relation_edges(joint, full)
        sx, sy = _edge_subset(lay, *rel["saved"])
        gx, gy = _edge_subset(lay, *rel["grads"])
        traces.append(_line_trace(sx, sy, "saved activations", "rgba(255,140,0,0.3)", 1,
                                  visible=True if n <= 5000 else "legendonly"))
        traces.append(_line_trace(gx, gy, "param → grad", "rgba(44,160,44,0.6)", 1.2, "dot",
                                  "legendonly"))
    traces.extend(_node_traces(data, lay, color_by, size))
    if any(m.get("recompute") for m in data.info):
        traces.append(_recompute_legend())
    names = [highlight] if isinstance(highlight, str) else list(highlight or [])
    hi = highlight_indices(data, names)
    traces.append(go.Scattergl(x=lay.x[hi], y=lay.y[hi], mode="markers", name="selected",
                               hoverinfo="skip", showlegend=bool(len(hi)),
                               marker={"size": 16, "color": "rgba(0,0,0,0)",
                                       "line": {"width": 2.5, "color": "#111"}}))
    if title is None:
        nf = sum(not b for b in data.is_bwd)
        what = f"{n} module groups (depth {depth})" if data.members else f"{n} nodes"
        title = (f"Joint graph: {what}. Forward ({nf}) left→right on top, "
                 f"backward ({n - nf}) mirrored below")
    fig = DagFigure(traces)
    fig.update_layout(
        title={"text": html.escape(title), "font": {"size": 14}}, height=height,
        template="plotly_white", hovermode="closest", dragmode="pan",
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        legend={"orientation": "h", "y": -0.02, "yanchor": "top"},
        xaxis={"visible": False}, yaxis={"visible": False},
        shapes=[{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": 0, "y1": 0,
                 "line": {"color": "rgba(0,0,0,0.15)", "width": 1, "dash": "dot"}}],
        annotations=[
            {"xref": "paper", "x": 0, "y": float(lay.y.max(initial=1)) + 0.6, "text": "forward →",
             "showarrow": False, "xanchor": "left", "font": {"color": PHASE_COLORS["forward"]}},
            {"xref": "paper", "x": 0, "y": float(lay.y.min(initial=-1)) - 0.6,
             "text": "← backward", "showarrow": False, "xanchor": "left",
             "font": {"color": PHASE_COLORS["backward"]}}])
    fig.update_layout(modebar_add=["select2d", "lasso2d"])
    fig._jointlab_data = data  # for explore(); plotly ignores unknown attributes
    fig._jointlab_layout = lay  # node positions, for overlays (viz/diff.py)
    return fig
