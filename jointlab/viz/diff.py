"""``plot_diff``: a :class:`jointlab.analysis.diff.GraphDiff` drawn on the DAG of ``joint_b``.

The figure is :func:`jointlab.viz.dag.plot_dag` of the graph after the
change, with overlays: added nodes ringed green, changed nodes ringed
orange, the first node whose value differs ringed black, and each removed
node as a red cross at the position of its nearest surviving neighbour (the
partner of one of its inputs, else of one of its users). With ``depth`` the
DAG is collapsed to module groups and a group is ringed when it holds a
node of that kind. Hover texts name the nodes.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go

from jointlab.errors import PlotArgumentError
from jointlab.viz._dagfigure import DagFigure
from jointlab.viz._dagfigure import dag_figure as plot_dag

if TYPE_CHECKING:
    import torch.fx as fx

    from jointlab.analysis.diff import GraphDiff
    from jointlab.core import TracedGraph

__all__ = ["DIFF_COLORS", "plot_diff"]

DIFF_COLORS = {"added": "#2ca02c", "changed": "#ff7f0e", "removed": "#d62728",
               "first value difference": "#111111"}


def _position_of(data: Any) -> dict[str, int]:
    """Graph node name -> index of the drawn node (itself, or its module group)."""
    if not data.members:
        return {n: i for i, n in enumerate(data.names)}
    return {m: k for k, group in enumerate(data.members) for m in group}


def _removed_anchor(node: fx.Node, matched: Any) -> str | None:
    """The partner in ``joint_b`` of a matched input of ``node``, else of a matched user."""
    for near in (*node.all_input_nodes, *node.users):
        if near.name in matched:
            return matched[near.name]
    return None


def _overlay(name: str, idx: list[int], labels: list[str], lay: Any, *, symbol: str,
             size: float) -> go.Scattergl:
    color = DIFF_COLORS[name]
    marker = ({"size": size, "color": color, "symbol": symbol} if symbol != "circle-open"
              else {"size": size, "color": "rgba(0,0,0,0)", "line": {"width": 3, "color": color}})
    ix = np.asarray(idx, dtype=np.int64)
    return go.Scattergl(x=lay.x[ix], y=lay.y[ix], mode="markers", name=f"{name} ({len(labels)})",
                        text=[html.escape(t) for t in labels], marker=marker,
                        hovertemplate=f"{name}: %{{text}}<extra></extra>")


def _marks(d: GraphDiff, joint_a: TracedGraph, at: dict[str, int]
           ) -> dict[str, tuple[list[int], list[str]]]:
    """Per overlay: drawn-node indices and the hover label of each mark."""
    out: dict[str, tuple[list[int], list[str]]] = {k: ([], []) for k in DIFF_COLORS}
    for change in ("added", "changed"):
        for _, row in d.table[d.table["change"] == change].iterrows():
            out[change][0].append(at[row["node_b"]])
            out[change][1].append(f"{row['node_b']} ({row['op_b']}) {row['what']}".strip())
    removed = set(d.removed["node_a"])
    for n in joint_a.graph.nodes:
        anchor = _removed_anchor(n, d.matched) if n.name in removed else None
        if anchor is not None:
            out["removed"][0].append(at[anchor])
            out["removed"][1].append(f"{n.name} (was next to {anchor})")
    if d.first_value_difference is not None:
        first = d.first_value_difference
        out["first value difference"][0].append(at[first.node_b])
        out["first value difference"][1].append(str(first))
    return out


def plot_diff(d: GraphDiff, joint_a: TracedGraph, joint_b: TracedGraph, *,
              depth: int | None = None, **plot_kw: Any) -> DagFigure:
    """Draw ``d`` on the DAG of ``joint_b``: added, changed and removed nodes marked.

    Args:
        d: What ``jl.diff(joint_a, joint_b, ...)`` returned.
        joint_a: The graph before.
        joint_b: The graph after (the one drawn).
        depth: Collapse the DAG to module groups of this depth (see ``plot_dag``).
        **plot_kw: Further :func:`jointlab.viz.dag.plot_dag` options (``color_by``, ``height``).

    Returns:
        A :class:`jointlab.viz.dag.DagFigure` with one overlay trace per kind of change.

    Raises:
        PlotArgumentError: ``d`` was not computed from these two graphs as they are now.
    """
    if not d.describes(joint_a, joint_b):
        raise PlotArgumentError(
            f"this diff was computed for other graphs (of {d.nodes_a} and {d.nodes_b} nodes), "
            "or they were edited since: pass the two graphs given to jl.diff, or diff again")
    title = plot_kw.pop("title", None) or (
        f"Diff: +{len(d.added)} added, -{len(d.removed)} removed, ~{len(d.changed)} changed"
        + (f"; first value difference at {d.first_value_difference.node_b}"
           if d.first_value_difference else ""))
    fig = plot_dag(joint_b, depth=depth, title=title, **plot_kw)
    lay, at = fig._jointlab_layout, _position_of(fig._jointlab_data)
    styles = {"added": ("circle-open", 18), "changed": ("circle-open", 18),
              "removed": ("x", 11), "first value difference": ("circle-open", 24)}
    for name, (idx, labels) in _marks(d, joint_a, at).items():
        symbol, size = styles[name]
        fig.add_trace(_overlay(name, idx, labels, lay, symbol=symbol, size=size))
    return fig
