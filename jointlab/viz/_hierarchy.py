"""The module tree of a joint graph, and the deepest collapse level that fits a budget.

Groups are module FQN prefixes (``h``, ``h.3``, ``h.3.attn``); every node
belongs to the group of its own module. A group that holds nothing but one
child group is folded into that child, so levels count from where the
module tree branches: HF GPT-2's ``transformer.h.N`` blocks sit one level
below ``transformer.h``, exactly like ``h.N`` in a flat model.

Everything here reads annotations; nothing is written back to the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jointlab.meta import TRAIN_FN


@dataclass
class ModuleTree:
    """Groups in parent-before-child order; group 0 is the root module.

    Attributes:
        names: Group FQN (``""`` for the root).
        parent: Parent group index, -1 for the root.
        level: Branching depth (root 0, its children 1, ...).
        node_group: Per graph node, the index of its own module's group.
    """

    names: list[str]
    parent: np.ndarray
    level: np.ndarray
    node_group: np.ndarray


def prefixes(module: str) -> list[str]:
    """The group names on a module's path, outermost first (``h``, ``h.0``, ``h.0.attn``)."""
    if module in ("", TRAIN_FN):
        return [module] if module else []
    parts = module.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts) + 1)]


def _raw_tree(modules: list[str]) -> tuple[list[str], dict[str, str]]:
    """Every module prefix and its parent prefix (root ``""``)."""
    parent_of: dict[str, str] = {}
    for m in dict.fromkeys(modules):
        chain = prefixes(m)
        for k, p in enumerate(chain):
            parent_of.setdefault(p, chain[k - 1] if k else "")
    return ["", *sorted(parent_of, key=lambda p: (p.count("."), p))], parent_of


def module_tree(modules: list[str]) -> ModuleTree:
    """Build the folded module tree of the nodes' ``module`` annotations.

    Args:
        modules: The ``module`` annotation of every node, in node order.

    Returns:
        The :class:`ModuleTree`.
    """
    names, parent_of = _raw_tree(modules)
    direct = set(modules)
    children: dict[str, list[str]] = {n: [] for n in names}
    for child, par in parent_of.items():
        children[par].append(child)
    # fold a group that holds only one child group and no nodes into that child
    alias = {n: n for n in names}
    for n in names[1:]:
        if n not in direct and len(children[n]) == 1:
            alias[n] = None  # removed; its child takes its parent
    def kept_parent(n: str) -> str:
        p = parent_of[n]
        while p and alias[p] is None:
            p = parent_of[p]
        return p
    kept = [n for n in names if alias[n] is not None]
    index = {n: i for i, n in enumerate(kept)}
    parent = np.full(len(kept), -1, dtype=np.int64)
    level = np.zeros(len(kept), dtype=np.int64)
    for i, n in enumerate(kept[1:], start=1):
        parent[i] = index[kept_parent(n)]
    order = sorted(range(len(kept)), key=lambda i: _depth(parent, i))
    remap = {old: new for new, old in enumerate(order)}
    kept = [kept[i] for i in order]
    parent = np.asarray([remap[parent[i]] if parent[i] >= 0 else -1 for i in order])
    for i in range(1, len(kept)):
        level[i] = level[parent[i]] + 1
    index = {n: i for i, n in enumerate(kept)}
    node_group = np.asarray([index[m] if m in index else 0 for m in modules], dtype=np.int64)
    return ModuleTree(kept, parent, level, node_group)


def _depth(parent: np.ndarray, i: int) -> int:
    d = 0
    while parent[i] >= 0:
        i, d = int(parent[i]), d + 1
    return d


def visible_count(tree: ModuleTree, is_bwd: np.ndarray, expanded: np.ndarray) -> int:
    """Items drawn when ``expanded`` groups are open.

    Open groups show their own nodes; each closed child shows one box per band.

    Args:
        tree: The module tree.
        is_bwd: Per node, whether it is drawn in the backward band.
        expanded: Per group, open or not (closed groups hide their whole subtree).

    Returns:
        The number of nodes and boxes on screen.
    """
    shown = np.zeros(len(tree.names), dtype=bool)  # group is inside open groups only
    shown[0] = True
    for g in range(1, len(tree.names)):
        shown[g] = shown[tree.parent[g]] and expanded[tree.parent[g]]
    open_ = shown & expanded
    nodes = int(open_[tree.node_group].sum())
    bands = group_bands(tree, is_bwd)
    boxes = int(bands[shown & ~expanded].sum())
    return nodes + boxes


def group_bands(tree: ModuleTree, is_bwd: np.ndarray) -> np.ndarray:
    """Per group, how many bands (1 or 2) its subtree has nodes in."""
    has = np.zeros((len(tree.names), 2), dtype=bool)
    g = tree.node_group.copy()
    band = np.asarray(is_bwd, dtype=np.int64)
    while len(g):
        has[g, band] = True
        keep = tree.parent[g] >= 0
        g, band = tree.parent[g][keep], band[keep]
    return has.sum(axis=1)


def fitting_expansion(tree: ModuleTree, is_bwd: np.ndarray, budget: int) -> np.ndarray:
    """Open whole levels, root first, while the drawn items stay within ``budget``.

    Args:
        tree: The module tree.
        is_bwd: Per node band.
        budget: Most nodes and boxes to draw at first.

    Returns:
        Per group, whether it starts open (the root always does).
    """
    expanded = np.zeros(len(tree.names), dtype=bool)
    expanded[0] = True
    for lvl in range(1, int(tree.level.max(initial=0)) + 1):
        trial = expanded | (tree.level == lvl)
        if visible_count(tree, is_bwd, trial) > budget:
            break
        expanded = trial
    return expanded
