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

__all__ = ["KEY_CATEGORIES", "expansion", "label_tiers", "node_label", "plumbing", "view_items"]


def node_label(node: Any, m: dict[str, Any], ops: dict[Any, str] | None = None) -> str:
    """Short label: parameter/buffer FQN, input path, else the op name (``mm``).

    ``ops`` memoises op names by ``(op, target)`` across the nodes of one graph.
    """
    if m.get("fqn"):
        return str(m["fqn"])
    if m.get("input_path"):
        return str(m["input_path"])
    if ops is None:
        return _meta.op_name(node)
    key = (node.op, node.target)
    if key not in ops:
        ops[key] = _meta.op_name(node)
    return ops[key]


#: Categories whose ops are what a reader looks for first (labelled before anything else).
KEY_CATEGORIES = frozenset({"matmul", "conv", "norm", "collective"})
_KEY_WORDS = ("loss", "softmax", "attention", "embedding")


def _is_key_op(label: str, category: str) -> bool:
    return category in KEY_CATEGORIES or any(w in label for w in _KEY_WORDS)


def label_tiers(nodes: list[Any], infos: list[dict[str, Any]], labels: list[str]) -> list[int]:
    """Per node its label priority: where labels compete for room, lower tiers win.

    0: key ops (:data:`KEY_CATEGORIES`, losses, softmax, attention, embeddings);
    1: placeholders and the graph's output; 2: other computing ops; 3: plumbing: views,
    and ops that read no placeholder (constants such as an attention mask built from
    ``arange``/``full``).

    Args:
        nodes: The graph's nodes, in order.
        infos: Their :func:`jointlab.meta.info` dicts.
        labels: Their labels (:func:`node_label`).

    Returns:
        One tier per node.
    """
    index = {n: i for i, n in enumerate(nodes)}
    const = [False] * len(nodes)
    out = []
    for i, (n, m, lab) in enumerate(zip(nodes, infos, labels)):
        ins = n.all_input_nodes
        const[i] = n.op == "call_function" and all(const[index[a]] for a in ins)
        cat = str(m.get("category", ""))
        if n.op in ("placeholder", "output"):
            out.append(1)
        elif const[i] or cat == "view" or lab in ("detach", "alias"):
            out.append(3)
        else:
            out.append(0 if _is_key_op(lab, cat) else 2)
    return out


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


def plumbing(nodes: list[Any], infos: list[dict[str, Any]]) -> np.ndarray:
    """Per node, whether it is plumbing: what a static figure may fold into its edges.

    Plumbing is :func:`label_tiers` 3: views, ``getitem``, ``detach``, and ops that read
    no placeholder, such as an attention mask's ``arange``/``full``.
    """
    labels = [node_label(n, m) for n, m in zip(nodes, infos)]
    return np.asarray(label_tiers(nodes, infos, labels), dtype=np.int64) == 3


def _fitting(tree: _hierarchy.ModuleTree, is_bwd: np.ndarray, budget: int,
             fold: np.ndarray) -> np.ndarray:
    """Whole levels open, root first, while boxes plus unfolded open nodes fit ``budget``."""
    bands = _hierarchy.group_bands(tree, is_bwd)
    expanded = np.zeros(len(tree.names), dtype=bool)
    expanded[0] = True
    for lvl in range(1, int(tree.level.max(initial=0)) + 1):
        trial = expanded | (tree.level == lvl)
        shown = np.zeros(len(tree.names), dtype=bool)
        shown[0] = True
        for g in range(1, len(tree.names)):
            shown[g] = shown[tree.parent[g]] and trial[tree.parent[g]]
        count = int((shown & trial)[tree.node_group][~fold].sum()) + int(
            bands[shown & ~trial].sum())
        if count > budget:
            break
        expanded = trial
    return expanded


def _bridged_pairs(nodes: list[Any], item: np.ndarray, folded: np.ndarray
                   ) -> list[tuple[int, int]]:
    """Item edges, an edge through folded nodes joining what feeds them to what reads them."""
    index = {n: i for i, n in enumerate(nodes)}
    reps: list[frozenset[int]] = []
    pairs = set()
    for i, n in enumerate(nodes):  # graph order: inputs come first
        srcs = frozenset().union(*(reps[index[a]] for a in n.all_input_nodes))
        if folded[i]:
            reps.append(srcs)
            continue
        reps.append(frozenset((int(item[i]),)))
        pairs.update((s, int(item[i])) for s in srcs if s != item[i])
    return sorted(pairs)


def view_items(joint: Any, depth: int | str | None = "auto", budget: int = 60,
               fold_plumbing: bool = False) -> tuple[DagData, list[int]]:
    """The visible items of ``joint``'s view, in graph order of their first node.

    Args:
        joint: A traced joint graph.
        depth: Module-tree levels open (levels count where the tree branches),
            ``"auto"`` (whole levels while at most ``budget`` items), or ``None`` (all).
        budget: The item budget of ``depth="auto"``.
        fold_plumbing: Leave out open plumbing nodes (:func:`plumbing`), an edge through
            them joining what feeds them to what reads them; ``"auto"`` then counts the
            items left. Boxes still hold theirs.

    Returns:
        The items as :class:`DagData` (a box's ``info`` holds its counts and sums,
        its ``members`` the node names; a node item's ``members`` is just itself),
        and each item's rank (its first node's index in graph order).
    """
    nodes = list(joint.graph.nodes)
    infos = [_meta.info(n) for n in nodes]
    is_bwd = np.asarray([m.get("phase") in BACKWARD_PHASES for m in infos], dtype=bool)
    tree = _hierarchy.module_tree([m.get("module", "") for m in infos])
    fold = plumbing(nodes, infos) if fold_plumbing else np.zeros(len(nodes), dtype=bool)
    open_ = (_fitting(tree, is_bwd, budget, fold) if fold_plumbing and depth == "auto"
             else expansion(tree, is_bwd, depth, budget))
    rep = np.full(len(tree.names), -1, dtype=np.int64)
    for g in range(len(tree.names)):  # parents come first
        p = int(tree.parent[g])
        rep[g] = rep[p] if p >= 0 and rep[p] >= 0 else (-1 if open_[g] or g == 0 else g)
    folded = fold & (rep[tree.node_group] < 0)  # open plumbing nodes only
    key_of: dict[tuple[int, int], int] = {}
    item = np.full(len(nodes), -1, dtype=np.int64)
    for i in np.flatnonzero(~folded).tolist():
        r = int(rep[tree.node_group[i]])
        key = (-1, i) if r < 0 else (r, int(is_bwd[i]))
        item[i] = key_of.setdefault(key, len(key_of))
    members: list[list[int]] = [[] for _ in key_of]
    for i, it in enumerate(item.tolist()):
        if it >= 0:
            members[it].append(i)
    pairs = _bridged_pairs(nodes, item, folded)
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
