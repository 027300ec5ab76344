"""Inductor's post-grad graph against the traced one: which traced node a value belongs to.

Inductor's provenance (``postToPre``) derives each post-grad node from traced
nodes; :func:`traced_owner` picks the one whose result it holds (the last in
graph order, never a ``detach`` or view of another of them) and
:func:`origin_name` follows that node back through views to the op that
computed its values. Where every kernel matched its post-grad node,
:func:`first_decomposed_divergence` names the first traced op whose value
after Inductor's decompositions and graph passes differs from its own
(:class:`DecomposedDivergence`), both graphs run eagerly on the same inputs.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from jointlab import meta as _meta
from jointlab.analysis.compare.judge import Tolerance, close, errors
from jointlab.analysis.compare.scale import produced_scale
from jointlab.analysis.value_stats import SAME_VALUES

__all__ = ["DecomposedDivergence", "first_decomposed_divergence", "origin_name",
           "traced_owner"]


@dataclass(frozen=True)
class DecomposedDivergence:
    """The first traced-graph op whose value in Inductor's post-grad graph differs.

    Attributes:
        node: The traced (joint-graph) node, and ``post_node`` the post-grad node
            holding its value after Inductor's decompositions and graph passes.
    """

    node: str
    post_node: str
    max_abs_err: float
    max_rel_err: float

    def __str__(self) -> str:
        """One line: the traced node, the post-grad node and the error."""
        return (f"{self.node} (post-grad {self.post_node}): max abs err "
                f"{self.max_abs_err:.3g}, max rel err {self.max_rel_err:.3g}")


def origin_name(owner: str, by_name: dict[str, fx.Node]) -> str:
    """The op that computed traced node ``owner``'s values, back through views and detaches.

    Args:
        owner: A traced node name (:func:`traced_owner`), or ``""``.
        by_name: The traced graph's nodes by name.

    Returns:
        That op's name; ``owner`` itself when it is not a traced node.
    """
    return _value_origin(by_name[owner]).name if owner in by_name else owner


def _value_origin(node: fx.Node) -> fx.Node:
    """The op that computed ``node``'s values: back through views, detaches and clones."""
    while (_meta.op_name(node) in SAME_VALUES and node.args
           and isinstance(node.args[0], fx.Node) and node.args[0].op == "call_function"):
        node = node.args[0]
    return node


def _aliases_another(node: fx.Node, pres: list[str]) -> bool:
    """True when ``node`` only passes on another node of ``pres``'s values (rearranged).

    make_fx's ``detach`` of a value saved for the backward, a ``view`` Inductor
    folds into the kernel: a post-grad node derived from one and its argument
    holds the argument's result.
    """
    return (_meta.op_name(node) in SAME_VALUES and bool(node.args)
            and getattr(node.args[0], "name", None) in pres)


def traced_owner(pres: list[str], traced: dict[str, fx.Node]) -> str:
    """The traced node a post-grad node derived from ``pres`` holds the result of.

    The last of ``pres`` in graph order (a pattern's ``addmm`` belongs to the
    ``add`` it ends in) that is not a ``detach`` or view of another of them.

    Args:
        pres: Traced node names Inductor's provenance (``postToPre``) derives it from.
        traced: The traced graph's nodes by name, in graph order.

    Returns:
        The node's name, or ``""`` when no name of ``pres`` is a traced node.
    """
    order = {name: i for i, name in enumerate(traced)}
    pres = [p for p in pres if p in order]
    owners = [p for p in pres if not _aliases_another(traced[p], pres)] or pres
    return max(owners, key=order.__getitem__) if owners else ""


def _group_outputs(compiled: Any, gm: fx.GraphModule) -> dict[str, list[str]]:
    """``{traced node: post-grad nodes holding its results}`` from Inductor's provenance.

    A post-grad node belongs to the last traced node (in graph order) it derives
    from, never to a ``detach`` or view of another of them (a log-softmax's
    result is derived from the ``_log_softmax`` and its ``detach`` nodes: it is
    the ``_log_softmax``'s); it holds a result of that node when a node of another
    group (or the graph's output) reads it.
    """
    post_to_pre = (compiled.compiled.provenance or {}).get("postToPre", {})
    traced = {n.name: n for n in compiled.source.graph.nodes}
    group: dict[fx.Node, str] = {}
    for post in (n for n in gm.graph.nodes if n.op == "call_function"):
        if owner := traced_owner(post_to_pre.get(post.name, []), traced):
            group[post] = owner
    out: dict[str, list[str]] = {}
    for post, owner in group.items():
        if any(group.get(u) != owner for u in post.users):
            out.setdefault(owner, []).append(post.name)
    return out


def first_decomposed_divergence(compiled: Any, gm: fx.GraphModule, post: dict[str, Any],
                                traced: dict[str, Any], tol: Tolerance
                                ) -> DecomposedDivergence | None:
    """The first traced op, in graph order, whose post-grad value differs from its own.

    Args:
        compiled: A :class:`jointlab.CompiledJoint` (``backend="inductor"``) that has run.
        gm: Inductor's post-grad graph.
        post: Its node values, run eagerly
            (:func:`jointlab.analysis.kernel_probe._reference`).
        traced: The traced graph's node values on the same inputs.
        tol: How values are judged; relative to the magnitudes that produced each
            traced value too (:mod:`jointlab.analysis.compare.scale`).

    Returns:
        The first differing pair, or None when every paired value matches.
    """
    results = _group_outputs(compiled, gm)

    def value_of(n: fx.Node) -> Any:
        return traced.get(n.name)

    for node in compiled.source.graph.nodes:
        want = traced.get(node.name)
        owner = node.args[0] if node.target is operator.getitem else node  # a tuple's part
        cands = [p for p in results.get(getattr(owner, "name", ""), [])
                 if isinstance(want, torch.Tensor) and isinstance(post.get(p), torch.Tensor)
                 and post[p].shape == want.shape]
        scale = produced_scale(node, value_of) if cands else None
        if not cands or any(close(post[p], want, tol) or close(post[p], want, tol, scale)
                            for p in cands):
            continue
        held = min(cands, key=lambda p: errors(post[p], want)[0])
        abs_err, rel_err, _ = errors(post[held], want)
        return DecomposedDivergence(owner.name, held, abs_err, rel_err)
    return None
