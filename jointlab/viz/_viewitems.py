"""The items ``dag_view`` draws at an expansion: open nodes and one box per closed group and band.

Mirrors the renderer's visibility step (``update`` / ``_itemOfNode`` in
``static/dag_layout.js``): a node whose module groups are all open is drawn
itself; otherwise it is drawn as the box of its outermost closed group, one
box per band. Edges between items are the graph's edges regrouped (no self
loops, one per pair); a backward item's twin is the item holding its
forward twin (a box's twin: the same group's forward box). The static
export lays these items out with the same layout as the view.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from jointlab import meta as _meta
from jointlab.viz import _hierarchy
from jointlab.viz._dagdata import BACKWARD_PHASES, DagData

__all__ = ["expansion", "view_items"]


def expansion(tree: _hierarchy.ModuleTree, is_bwd: np.ndarray, depth: int | str | None,
              budget: int) -> np.ndarray:
    """Which groups are open: ``depth`` levels, all (``None``), or as many as fit ``budget``."""
    if depth is None:
        return np.ones(len(tree.names), dtype=bool)
    if depth == "auto":
        return _hierarchy.fitting_expansion(tree, is_bwd, budget)
    return tree.level < max(int(depth), 1)


def _group_info(name: str, bwd: bool, infos: list[dict[str, Any]], members: list[int]
                ) -> dict[str, Any]:
    ops = Counter(str(infos[i].get("target", "")) for i in members)
    phases = Counter(str(infos[i].get("phase", "")) for i in members)
    return {"phase": "backward" if bwd else "forward", "module": _meta.module_label(name),
            "count": len(members), "group": True,
            "flops": int(sum(int(infos[i].get("flops", 0) or 0) for i in members)),
            "bytes": int(sum(int(infos[i].get("bytes", 0) or 0) for i in members)),
            "phases": dict(phases), "top_ops": ops.most_common(4), "category": "group",
            "recompute": sum(bool(infos[i].get("recompute")) for i in members)}


def view_items(joint: Any, depth: int | str | None = "auto", budget: int = 60
               ) -> tuple[DagData, list[int]]:
    """The visible items of ``joint``'s view, in graph order of their first node.

    Args:
        joint: A traced joint graph.
        depth: Module-tree levels open (levels count where the tree branches),
            ``"auto"`` (whole levels while at most ``budget`` items), or ``None`` (all).
        budget: The item budget of ``depth="auto"``.

    Returns:
        The items as :class:`DagData` (a box's ``info`` holds its counts and sums,
        its ``members`` the node names; a node item's ``members`` is just itself),
        and each item's rank (its first node's index in graph order).
    """
    nodes = list(joint.graph.nodes)
    infos = [_meta.info(n) for n in nodes]
    is_bwd = np.asarray([m.get("phase") in BACKWARD_PHASES for m in infos], dtype=bool)
    tree = _hierarchy.module_tree([m.get("module", "") for m in infos])
    open_ = expansion(tree, is_bwd, depth, budget)
    rep = np.full(len(tree.names), -1, dtype=np.int64)
    for g in range(len(tree.names)):  # parents come first
        p = int(tree.parent[g])
        rep[g] = rep[p] if p >= 0 and rep[p] >= 0 else (-1 if open_[g] or g == 0 else g)
    key_of: dict[tuple[int, int], int] = {}
    item = np.empty(len(nodes), dtype=np.int64)
    for i in range(len(nodes)):
        r = int(rep[tree.node_group[i]])
        key = (-1, i) if r < 0 else (r, int(is_bwd[i]))
        item[i] = key_of.setdefault(key, len(key_of))
    members: list[list[int]] = [[] for _ in key_of]
    for i, it in enumerate(item.tolist()):
        members[it].append(i)
    index = {n: i for i, n in enumerate(nodes)}
    pairs = {(int(item[index[a]]), int(item[i])) for i, n in enumerate(nodes)
             for a in n.all_input_nodes}
    pairs = sorted(p for p in pairs if p[0] != p[1])
    names, info, twin = [], [], []
    by_name = {n.name: i for i, n in enumerate(nodes)}
    for (g, b), it in key_of.items():
        if g < 0:
            names.append(nodes[b].name)
            info.append(infos[b])
            t = by_name.get(infos[b].get("fwd_twin"), -1)
            twin.append(int(item[t]) if is_bwd[b] and t >= 0 and not is_bwd[t] else -1)
        else:
            gname = tree.names[g]
            names.append(f"{'bwd' if b else 'fwd'}:{_meta.module_label(gname)}")
            info.append(_group_info(gname, bool(b), infos, members[it]))
            twin.append(key_of.get((g, 0), -1) if b else -1)
    data = DagData(names, info, np.asarray([p[0] for p in pairs], dtype=np.int64),
                   np.asarray([p[1] for p in pairs], dtype=np.int64), twin,
                   [[nodes[i].name for i in ms] for ms in members])
    return data, [ms[0] for ms in members]
