"""``dag_view``: the joint graph in a small bundled canvas renderer (no plotly, no CDN).

The view opens collapsed to the deepest module level that fits a node
budget (:mod:`jointlab.viz._hierarchy`); clicking a group opens it in place.
The payload carries no positions: the renderer lays out only what is
visible (open nodes and one box per closed group and band) with a layered
layout of its own, and again on every open or close, so the cost follows
the visible items, not the graph.
The payload is compact: string tables plus integer arrays, JSON inside a
``<script type="application/json">`` with ``<``, ``>`` and ``&`` escaped, so
a hostile module name is data, never markup. The renderer's readable source
is ``jointlab/viz/static/dag_*.js`` (:data:`JS_PARTS`: common helpers, layout,
model, drawing, interaction), concatenated by :func:`renderer_js` into one
function scope and inlined; nothing is fetched. The payload's fields are
described once, in :data:`PAYLOAD_SCHEMA`, which the JS parts refer to.
"""

from __future__ import annotations

import html
import json
import pathlib
import secrets
from functools import cache
from typing import Any

import numpy as np

from jointlab import meta as _meta
from jointlab.passes.analyze import require_analyzed
from jointlab.viz import _hierarchy, _legend
from jointlab.viz._style import PALETTE, PHASE_COLORS, module_colors
from jointlab.viz._viewitems import label_tiers, node_label

JS_DIR = pathlib.Path(__file__).parent / "static"
#: The renderer's parts, in the order they are concatenated (each may use what comes before).
JS_PARTS = ("dag_common.js", "dag_layout.js", "dag_model.js", "dag_draw.js",
            "dag_interact.js")
#: What :func:`build_payload` returns and the renderer reads (``P`` in the JS parts).
#: Node and group fields are parallel arrays; string fields hold an index into ``tables``.
PAYLOAD_SCHEMA = """
title        str: the view's title
nodes        per node i, in graph order:
  name         FX node name (unique)
  label        -> tables.label: parameter/buffer FQN, input path, else op name (``mm``)
  target       -> tables.target: the op (``aten.mm.default``) or FX op
  ph           -> tables.phase: param, buffer, input, forward, backward, output
  shape        -> tables.shape: ``2×8×32`` or ""
  dtype        -> tables.dtype
  cat          -> tables.cat: cost category
  src          -> tables.source: user source line
  twin         index of the forward twin of a backward node, else -1
  tier         label priority (viz._viewitems.label_tiers): 0 key ops first, 3 plumbing last
  flops, bytes int
  saved        indices of the nodes saved for backward (sparse)
  recompute    indices of the nodes recomputed by checkpointing (sparse)
  g            index of the node's module group (groups)
  extra        {str(i): {fqn, grad_of, input_path}} where set
  rows         optional {str(i): [[key, text], ...]}: extra detail-panel rows (diff view)
edges        flat [src, dst, src, dst, ...] node indices
groups       per module group (0 = root ""), parents before children:
  name, parent (-1 for the root), level (0 for the root), mtype (module class)
  color        index into palette: the module's colour, keyed by its name
               (viz._style.module_colors)
  count_f/_b, flops_f/_b, bytes_f/_b  sums over the group's subtree, forward/backward band
expanded     group indices open at first
tables       {label, target, phase, shape, dtype, cat, source, mtype}: string tables
palette      colours of categories; phase_colors {phase: colour}
backward_phases  phases drawn in the backward band (jointlab.meta.BACKWARD_PHASES)
color_by     initial colouring: module, phase, category, bytes, flops, or a layer name
budget       node budget the first view was opened to
layers       {name: {kind: num|cat, v (per node), gf/gb (per group), lo, hi | levels,
              colors, short}} extra colourings (see _numeric_layer, _category_layer)
hits         optional node indices found at first (the diff view: its changes), stepped
             through with next/previous like search hits
"""
DEFAULT_BUDGET = 2000
BACKWARD_PHASES = _meta.BACKWARD_PHASES


def title_text(joint: Any) -> str:
    """The view's title; its phase counts come from :func:`jointlab.meta.phase_counts`."""
    counts = _meta.phase_counts(joint.graph.nodes)
    parts = " · ".join(f"{p} {n:,}" for p, n in counts.items() if n)
    return f"Joint graph: {sum(counts.values()):,} nodes ({parts})"


class _Table:
    """A string table: each distinct string once, nodes hold indices."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.index: dict[str, int] = {}

    def __call__(self, s: Any) -> int:
        s = "" if s is None else str(s)
        if s not in self.index:
            self.index[s] = len(self.items)
            self.items.append(s)
        return self.index[s]


def _group_stats(tree: _hierarchy.ModuleTree, is_bwd: np.ndarray,
                 values: dict[str, np.ndarray]) -> dict[str, list[int]]:
    """Per group and band, sums of ``values`` over the group's whole subtree."""
    out = {}
    for key, v in values.items():
        acc = np.zeros((len(tree.names), 2), dtype=np.int64)
        g, band, val = tree.node_group.copy(), is_bwd.astype(np.int64), v.astype(np.int64)
        while len(g):
            np.add.at(acc, (g, band), val)
            keep = tree.parent[g] >= 0
            g, band, val = tree.parent[g][keep], band[keep], val[keep]
        out[key + "_f"], out[key + "_b"] = acc[:, 0].tolist(), acc[:, 1].tolist()
    return out


def _node_arrays(nodes: list[Any], infos: list[dict[str, Any]], t: dict[str, _Table]
                 ) -> dict[str, Any]:
    by_name = {n.name: i for i, n in enumerate(nodes)}
    cols: dict[str, list[Any]] = {k: [] for k in (
        "name", "label", "target", "ph", "shape", "dtype", "cat", "src", "twin", "flops",
        "bytes")}
    extra: dict[str, dict[str, str]] = {}
    ops: dict[Any, str] = {}
    saved: list[int] = []
    recompute: list[int] = []
    for i, (n, m) in enumerate(zip(nodes, infos)):
        shape = m.get("shape")
        cols["name"].append(n.name)
        cols["label"].append(t["label"](node_label(n, m, ops)))
        cols["target"].append(t["target"](m.get("target", n.op)))
        cols["ph"].append(t["phase"](m.get("phase", "")))
        cols["shape"].append(t["shape"]("×".join(map(str, shape)) if shape is not None else ""))
        cols["dtype"].append(t["dtype"](m.get("dtype", "")))
        cols["cat"].append(t["cat"](m.get("category", "")))
        cols["src"].append(t["source"](m.get("source", "")))
        cols["twin"].append(by_name.get(m.get("fwd_twin"), -1))
        cols["flops"].append(int(m.get("flops", 0) or 0))
        cols["bytes"].append(int(m.get("bytes", 0) or 0))
        if m.get("saved_for_backward"):
            saved.append(i)
        if m.get("recompute"):
            recompute.append(i)
        more = {k: str(m[k]) for k in ("fqn", "grad_of", "input_path") if m.get(k)}
        if more:
            extra[str(i)] = more
    cols["extra"], cols["saved"], cols["recompute"] = extra, saved, recompute
    cols["tier"] = label_tiers(nodes, infos, [t["label"].items[k] for k in cols["label"]])
    return cols


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def _numeric_layer(vals: list[Any], tree: _hierarchy.ModuleTree, is_bwd: np.ndarray
                   ) -> dict[str, Any]:
    """A numeric colouring: per node its value (``None`` if unknown), per group the max."""
    v = np.asarray([np.nan if x is None else float(x) for x in vals], dtype=np.float64)
    acc = np.full((len(tree.names), 2), -np.inf)
    g, band, val = tree.node_group.copy(), is_bwd.astype(np.int64), np.nan_to_num(v, nan=-np.inf)
    while len(g):
        np.maximum.at(acc, (g, band), val)
        keep = tree.parent[g] >= 0
        g, band, val = tree.parent[g][keep], band[keep], val[keep]
    fin = v[np.isfinite(v)]
    grp = [[None if not np.isfinite(x) else float(x) for x in col] for col in acc.T]
    return {"kind": "num", "v": [None if not np.isfinite(x) else float(x) for x in v],
            "gf": grp[0], "gb": grp[1],
            "lo": float(fin.min()) if len(fin) else 0.0,
            "hi": float(fin.max()) if len(fin) else 0.0}


def _category_layer(vals: list[Any], tree: _hierarchy.ModuleTree, is_bwd: np.ndarray
                    ) -> dict[str, Any]:
    """A categorical colouring: per node a level index, ``-1`` when unknown.

    Levels are ranked by node count (:func:`jointlab.viz._legend.rank_levels`); each has
    its colour (:func:`jointlab.viz._legend.level_colors`); the first
    :data:`~jointlab.viz._legend.LEGEND_LEVELS` have a short legend name. A group keeps a
    level only when every known node under it shares it; ``-2`` marks a mixed group.
    """
    labels = [None if x is None or x == "" else str(x) for x in vals]
    levels = _legend.rank_levels(labels)
    index = {x: k for k, x in enumerate(levels)}
    code = np.asarray([-1 if x is None else index[x] for x in labels], dtype=np.int64)
    acc = np.full((len(tree.names), 2), -1, dtype=np.int64)
    for i in np.flatnonzero(code >= 0):
        gid, band = int(tree.node_group[i]), int(is_bwd[i])
        while gid >= 0:
            cur = acc[gid, band]
            acc[gid, band] = code[i] if cur in (-1, code[i]) else -2
            gid = int(tree.parent[gid])
    return {"kind": "cat", "levels": levels, "v": code.tolist(),
            "gf": acc[:, 0].tolist(), "gb": acc[:, 1].tolist(),
            "colors": _legend.level_colors(levels, PALETTE),
            "short": [_legend.short_label(x) for x in levels[:_legend.LEGEND_LEVELS]]}


def _layers(nodes: list[Any], tree: _hierarchy.ModuleTree, is_bwd: np.ndarray,
            layers: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Extra colourings keyed by name; each maps node name to a number or a label."""
    out = {}
    for name, by_node in (layers or {}).items():
        vals = [by_node.get(n.name) for n in nodes]
        known = [x for x in vals if x is not None]
        numeric = bool(known) and all(_is_number(x) for x in known)
        out[str(name)] = (_numeric_layer if numeric else _category_layer)(vals, tree, is_bwd)
    return out


def build_payload(joint: Any, *, budget: int = DEFAULT_BUDGET, color_by: str = "module",
                  layers: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Everything the renderer needs, as JSON-friendly tables and integer arrays.

    Args:
        joint: A :class:`jointlab.JointGraph`.
        budget: Most nodes and boxes drawn at first; whole module levels open while it holds.
        color_by: Initial colouring: ``phase``, ``module``, ``category``, ``bytes``,
            ``flops``, or the name of one of ``layers``.
        layers: Extra colourings, ``{name: {node_name: value}}``. All-number values give a
            log colour scale (a group shows its largest value); any other values are labels
            (a group shows a label only when all its nodes share it). Nodes left out are
            unknown and drawn grey. Each layer's value also appears in the detail panel.

    Returns:
        The payload dict (its fields: :data:`PAYLOAD_SCHEMA`).
    """
    require_analyzed(joint.graph_module)
    nodes = list(joint.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    infos = [_meta.info(n) for n in nodes]
    edges = np.asarray([(index[a], i) for i, n in enumerate(nodes) for a in n.all_input_nodes],
                       dtype=np.int64).reshape(-1, 2)
    is_bwd = np.asarray([m.get("phase") in BACKWARD_PHASES for m in infos], dtype=bool)
    tree = _hierarchy.module_tree([m.get("module", "") for m in infos])
    expanded = _hierarchy.fitting_expansion(tree, is_bwd, budget)
    tables = {k: _Table() for k in ("label", "target", "phase", "shape", "dtype", "cat",
                                    "source", "mtype")}
    cols = _node_arrays(nodes, infos, tables)
    cols["g"] = tree.node_group.tolist()
    mtype = {m.get("module", ""): m.get("module_type", "") for m in infos}
    colors = module_colors(["", *(p for m in mtype for p in _hierarchy.prefixes(m))])
    groups = {"name": tree.names, "parent": tree.parent.tolist(), "level": tree.level.tolist(),
              "mtype": [mtype.get(n, "") for n in tree.names],
              "color": [PALETTE.index(colors[n]) for n in tree.names],
              **_group_stats(tree, is_bwd, {"count": np.ones(len(nodes)),
                                            "flops": np.asarray(cols["flops"]),
                                            "bytes": np.asarray(cols["bytes"])})}
    return {"title": title_text(joint), "nodes": cols, "edges": edges.ravel().tolist(),
            "groups": groups, "expanded": np.flatnonzero(expanded).tolist(),
            "tables": {k: v.items for k, v in tables.items()}, "palette": list(PALETTE),
            "phase_colors": PHASE_COLORS, "backward_phases": list(BACKWARD_PHASES),
            "color_by": color_by, "budget": budget,
            "layers": _layers(nodes, tree, is_bwd, layers)}


@cache
def renderer_js() -> str:
    """The renderer: the :data:`JS_PARTS` in one function scope, defining ``window.jointlabDag``.

    Returns:
        JavaScript source; a second copy on the same page leaves the first in place.
    """
    parts = "\n".join((JS_DIR / p).read_text(encoding="utf-8") for p in JS_PARTS)
    return ("(function () {\n  \"use strict\";\n  if (window.jointlabDag) return;\n"
            f"{parts}\n}})();\n")


def _json_for_script(obj: Any) -> str:
    text = json.dumps(obj, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


class DagView:
    """A displayable DAG: ``_repr_html_`` for notebooks, :meth:`html` for pages and reports.

    Attributes:
        payload: The data handed to the renderer.
        height: Canvas height in pixels.
    """

    def __init__(self, payload: dict[str, Any], height: int = 600) -> None:
        """Wrap a payload from :func:`build_payload`."""
        self.payload = payload
        self.height = height

    def html(self, full_html: bool = False) -> str:
        """The view as HTML: a container, the JSON payload and the inlined renderer.

        Args:
            full_html: Wrap in a complete ``<!DOCTYPE html>`` page.

        Returns:
            HTML text with no external resource.
        """
        uid = "jl-dag-" + secrets.token_hex(4)
        frag = (f'<div class="jl-dag" id="{uid}" style="height:{int(self.height)}px"></div>'
                f'<script type="application/json" id="{uid}-data">'
                f"{_json_for_script(self.payload)}</script>"
                f"<script>{renderer_js()}\n"
                f"window.jointlabDag({json.dumps(uid)});</script>")
        if not full_html:
            return frag
        return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
                f"<title>{html.escape(self.payload['title'])}</title></head>"
                f"<body style='margin:8px'>{frag}</body></html>")

    def _repr_html_(self) -> str:
        return self.html()

    def write_html(self, path: str | pathlib.Path) -> pathlib.Path:
        """Write a self-contained page; returns the path."""
        out = pathlib.Path(path)
        out.write_text(self.html(full_html=True), encoding="utf-8")
        return out


COLORINGS = ("phase", "module", "category", "bytes", "flops")


def dag_view(joint: Any, *, budget: int = DEFAULT_BUDGET, color_by: str = "module",
             height: int = 600, layers: dict[str, dict[str, Any]] | None = None) -> DagView:
    """The navigable DAG of a joint graph (labels, expand/collapse, search, detail panel).

    Args:
        joint: A :class:`jointlab.JointGraph`.
        budget: Most nodes and boxes to draw at first (whole module levels open while it holds;
            the view then closes its deepest open levels while the graph is too tall to show
            at a zoom where labels are drawn, 12 px a row).
        color_by: ``phase``, ``module``, ``category``, ``bytes``, ``flops`` or a layer name.
        height: Height in pixels.
        layers: Extra colourings ``{name: {node_name: number_or_label}}``, for example
            recorded gradient norms or the kernel that covers each node (see
            :func:`build_payload`).

    Returns:
        A :class:`DagView`; display it, or call ``.html()`` / ``.write_html(path)``.

    Raises:
        ValueError: Unknown ``color_by`` or a budget below 1.
    """
    allowed = COLORINGS + tuple(layers or ())
    if color_by not in allowed:
        raise ValueError(f"color_by must be one of {', '.join(allowed)}; got {color_by!r}")
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    return DagView(build_payload(joint, budget=budget, color_by=color_by, layers=layers),
                   height=height)
