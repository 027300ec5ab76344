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

The view it returns, a :class:`DiffView`, exports like the other views:
``view.export("diff.svg")`` (or ``.png``) draws the same DAG statically with
:func:`jointlab.export_figure`'s engine and page, items coloured by change in
the view's colours (a module box takes the change its changed nodes share), and
``view.export("diff.html")`` writes the interactive view as one standalone page.
"""

from __future__ import annotations

import pathlib
import re
from typing import TYPE_CHECKING, Any

from jointlab.errors import ExportError, PlotArgumentError
from jointlab.meta import op_name
from jointlab.viz import _svg
from jointlab.viz.dagview import DagView, build_payload

if TYPE_CHECKING:
    import torch.fx as fx

    from jointlab.analysis.diff import GraphDiff
    from jointlab.core import TracedGraph

__all__ = ["DIFF_COLORS", "DiffView", "diff_view", "plot_diff"]

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


_LEGEND = re.compile(r'<g class="legend-entry"><title>([^<]*)</title>'
                     r'<rect [^>]*stroke="(#[0-9a-f]{6})"')
_ATTR = re.compile(r'\b(fill|stroke)="(#[0-9a-f]{6})"')


def _recolored(svg: str) -> str:
    """The static DAG's label colours (ranked by frequency) replaced by :data:`DIFF_COLORS`."""
    swap = {"stroke": {}, "fill": {}}
    for label, color in _LEGEND.findall(svg):
        if (want := DIFF_COLORS.get(label)) is not None:
            swap["stroke"][color] = want
            for t in (0.8, 0.55):  # item fill, legend swatch fill
                swap["fill"][_svg.tint(color, t)] = _svg.tint(want, t)
    svg = _ATTR.sub(lambda m: f'{m[1]}="{swap[m[1]].get(m[2], m[2])}"', svg)  # all at once
    return svg.replace("<title>no label</title>", "<title>unchanged nodes</title>").replace(
        ">(none)</text>", ">same</text>")


class DiffView(DagView):
    """The diff view (:func:`diff_view`): displays like any DAG view, and exports.

    Attributes:
        change: ``{node of joint_b: "added" | "changed" | "next to removed"}``.
    """

    def __init__(self, payload: dict[str, Any], height: int, joint_b: TracedGraph,
                 change: dict[str, str], title: str) -> None:
        """Wrap a payload from :func:`diff_view` with what a static figure needs."""
        super().__init__(payload, height)
        self.change = change
        self._joint = joint_b
        self._title = title

    def svg_text(self, *, depth: int | str | None = "auto", max_groups: int = 60,
                 title: str | None = None, **page: Any) -> str:
        """The static SVG of the diff (see :meth:`export` for the arguments)."""
        from jointlab.viz.export import dag_svg_text

        svg = dag_svg_text(self._joint, depth=depth, max_groups=max_groups,
                           title=title or self._title, color_by="change",
                           layers={"change": self.change}, **page)
        return _recolored(svg)

    def export(self, path: str | pathlib.Path, *, depth: int | str | None = "auto",
               max_groups: int = 60, title: str | None = None, aspect: float | None = 1.414,
               width: float | None = None, arrange: str = "stacked",
               timeout_s: float = 60.0) -> pathlib.Path:
        """Write the diff as a static ``.svg``/``.png`` figure or a standalone ``.html`` page.

        Args:
            path: Output file; the suffix chooses the format.
            depth: Module-tree levels opened, ``"auto"`` (whole levels while at most
                ``max_groups`` items are drawn) or ``None`` (every node), as in
                :func:`jointlab.export_figure`; not used for ``.html``.
            max_groups: For ``depth="auto"``: the most items drawn.
            title: Heading (default: the counts of changes).
            aspect: The page's width/height (None: no target).
            width: The page width in pixels to fit.
            arrange: ``"stacked"`` (forward over backward) or ``"side"``.
            timeout_s: How long Chromium may take for a PNG.

        Returns:
            The path written.

        Raises:
            ExportError: Another suffix, a bad page argument, or no Chromium for a PNG.
        """
        out = pathlib.Path(path)
        suffix = out.suffix.lower()
        if suffix == ".html":
            return self.write_html(out)
        if suffix not in (".svg", ".png"):
            raise ExportError(f"a diff exports to .svg, .png or .html, got {out.name!r}")
        from jointlab.viz.export import write_svg_or_png

        return write_svg_or_png(self.svg_text(depth=depth, max_groups=max_groups, title=title,
                                              aspect=aspect, width=width, arrange=arrange),
                                out, timeout_s)


def diff_view(joint_a: TracedGraph, joint_b: TracedGraph, d: GraphDiff | None = None, *,
              depth: int | None = None, height: int = 600, title: str | None = None,
              budget: int | None = None) -> DiffView:
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
        A :class:`DiffView` coloured by ``change``, opened on the first change
        (``.export(path)`` writes it as ``.svg``, ``.png`` or ``.html``).

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
    return DiffView(payload, height, joint_b, level, title or _title(d))


def plot_diff(d: Any, joint_a: Any, joint_b: Any = None, **kw: Any) -> DiffView:
    """Draw a diff on the DAG of ``joint_b``: :func:`diff_view`, with the diff first.

    ``plot_diff(d, joint_a, joint_b, ...)`` as before, or ``plot_diff(joint_a, joint_b)``.

    Args:
        d: What ``jl.diff(joint_a, joint_b, ...)`` returned (or ``joint_a``).
        joint_a: The graph before (or ``joint_b`` when ``d`` is ``joint_a``).
        joint_b: The graph after.
        **kw: :func:`diff_view` options: ``depth``, ``height``, ``title``, ``budget``.

    Returns:
        A :class:`DiffView` (``.export(path)``: ``.svg``, ``.png`` or ``.html``).

    Raises:
        PlotArgumentError: ``d`` was not computed from these two graphs as they are now.
    """
    from jointlab.analysis.diff import GraphDiff

    if not isinstance(d, GraphDiff):
        return diff_view(d, joint_a, None, **kw)
    return diff_view(joint_a, joint_b, d, **kw)
