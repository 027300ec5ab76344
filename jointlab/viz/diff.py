"""The diff view: a :class:`jointlab.analysis.diff.GraphDiff` drawn by the DAG engine.

:func:`diff_view` (and ``jl.plot_diff``, which routes to it) shows the graph
after the change (``joint_b``) in the navigable canvas DAG
(:mod:`jointlab.viz.dagview`), coloured by a ``change`` layer: added nodes
green, changed ones orange, a surviving node next to a removed one red (the
partner of one of the removed node's inputs, else of one of its users),
the rest grey. The detail panel of a marked node says what changed, with each
changed argument's old and new value (``approximate: none -> tanh``), and the
view opens on the first change: the search bar's next/previous buttons step
through them ("1 of N"), each drawn with its whole label.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jointlab.errors import PlotArgumentError
from jointlab.meta import op_name
from jointlab.viz.dagview import DagView, build_payload

if TYPE_CHECKING:
    import torch.fx as fx

    from jointlab.analysis.diff import GraphDiff
    from jointlab.core import TracedGraph

__all__ = ["DIFF_COLORS", "diff_view", "plot_diff"]

#: Colours of the ``change`` layer, by level.
DIFF_COLORS = {"added": "#2ca02c", "changed": "#ff7f0e", "next to removed": "#d62728",
               "same": "#c8c8c8"}


def _removed_anchor(node: fx.Node, matched: Any) -> str | None:
    """The partner in ``joint_b`` of a matched input of ``node``, else of a matched user."""
    for near in (*node.all_input_nodes, *node.users):
        if near.name in matched:
            return matched[near.name]
    return None


def _changes(d: GraphDiff, joint_a: TracedGraph
             ) -> tuple[dict[str, str], dict[str, list[list[str]]]]:
    """Per node of ``joint_b``: its change level, and its detail-panel rows."""
    level: dict[str, str] = {}
    rows: dict[str, list[list[str]]] = {}
    for _, r in d.added.iterrows():
        level[r["node_b"]] = "added"
        rows[r["node_b"]] = [["what changed", "added (not in graph a)"]]
    for _, r in d.changed.iterrows():
        name = r["node_b"]
        level[name] = "changed"
        was = f" (was {r['node_a']})" if r["node_a"] != name else ""
        rows[name] = [["what changed", f"{r['what']}{was}"]]
        if r["op_a"] != r["op_b"] or "target" in r["what"]:
            rows[name].append(["op", f"{r['op_a']} -> {r['op_b']}"])
        for field in ("shape", "dtype"):
            if field in r["what"].split(", "):
                rows[name].append([field, f"{r[field + '_a']} -> {r[field + '_b']}"])
        for c in d.arg_changes.get(name, ()):
            rows[name].append([c.name, f"{c.old} -> {c.new}"])
    removed = set(d.removed["node_a"])
    for n in joint_a.graph.nodes:
        anchor = _removed_anchor(n, d.matched) if n.name in removed else None
        if anchor is None:
            continue
        level.setdefault(anchor, "next to removed")
        rows.setdefault(anchor, []).append(["removed here", f"{n.name} ({op_name(n)})"])
    if d.first_value_difference is not None:
        first = d.first_value_difference
        rows.setdefault(first.node_b, []).append(["first value difference", str(first)])
    return level, rows


def _title(d: GraphDiff) -> str:
    first = d.first_value_difference
    return (f"Diff: +{len(d.added)} added, -{len(d.removed)} removed, ~{len(d.changed)} changed"
            + (f"; first value difference at {first.node_b}" if first else ""))


def diff_view(joint_a: TracedGraph, joint_b: TracedGraph, d: GraphDiff | None = None, *,
              depth: int | None = None, height: int = 600, title: str | None = None,
              budget: int | None = None) -> DagView:
    """The DAG of ``joint_b`` with what changed since ``joint_a`` marked and explained.

    Args:
        joint_a: The graph before.
        joint_b: The graph after (the one drawn).
        d: What ``jl.diff(joint_a, joint_b, ...)`` returned; computed here (structure
            only) when None.
        depth: Open module groups above this level only (``None``: as the budget allows).
        height: Height in pixels.
        title: The view's title (default: the counts of changes).
        budget: Most nodes and boxes drawn at first (see :func:`jointlab.dag_view`).

    Returns:
        A :class:`jointlab.viz.dagview.DagView` coloured by ``change``, opened on the
        first change.

    Raises:
        PlotArgumentError: ``d`` was not computed from these two graphs as they are now.
    """
    if d is None:
        from jointlab.analysis.diff import diff

        d = diff(joint_a, joint_b)
    if not d.describes(joint_a, joint_b):
        raise PlotArgumentError(
            f"this diff was computed for other graphs (of {d.nodes_a} and {d.nodes_b} nodes), "
            "or they were edited since: pass the two graphs given to jl.diff, or diff again")
    level, rows = _changes(d, joint_a)
    names = [n.name for n in joint_b.graph.nodes]
    kw = {} if budget is None else {"budget": budget}
    payload = build_payload(joint_b, color_by="change",
                            layers={"change": {n: level.get(n, "same") for n in names}}, **kw)
    layer = payload["layers"]["change"]
    layer["colors"] = [DIFF_COLORS[x] for x in layer["levels"]]
    index = {n: i for i, n in enumerate(names)}
    payload["nodes"]["rows"] = {str(index[n]): r for n, r in rows.items()}
    payload["hits"] = sorted(index[n] for n in level)
    payload["title"] = title or f"{_title(d)} · {payload['title']}"
    if depth is not None:
        payload["expanded"] = [g for g, lv in enumerate(payload["groups"]["level"]) if lv < depth]
    return DagView(payload, height=height)


def plot_diff(d: Any, joint_a: Any, joint_b: Any = None, **kw: Any) -> DagView:
    """Draw a diff on the DAG of ``joint_b``: :func:`diff_view`, with the diff first.

    ``plot_diff(d, joint_a, joint_b, ...)`` as before, or ``plot_diff(joint_a, joint_b)``.

    Args:
        d: What ``jl.diff(joint_a, joint_b, ...)`` returned (or ``joint_a``).
        joint_a: The graph before (or ``joint_b`` when ``d`` is ``joint_a``).
        joint_b: The graph after.
        **kw: :func:`diff_view` options: ``depth``, ``height``, ``title``, ``budget``.

    Returns:
        A :class:`jointlab.viz.dagview.DagView`.

    Raises:
        PlotArgumentError: ``d`` was not computed from these two graphs as they are now.
    """
    from jointlab.analysis.diff import GraphDiff

    if not isinstance(d, GraphDiff):
        return diff_view(d, joint_a, None, **kw)
    return diff_view(joint_a, joint_b, d, **kw)
