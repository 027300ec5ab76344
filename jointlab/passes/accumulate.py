"""Where a gradient-accumulation add belongs: the forward value it sums the gradient of.

Part of the annotation pass (:func:`jointlab.passes.annotate.annotate` calls
:func:`attribute_accumulation`); it writes ``module``, ``module_type``,
``source`` and ``grad_acc_of`` of ``node.meta["jointlab"]`` on the
accumulation adds it can attribute.

Each summed term comes from the backward of one consumer of the value (the
term's forward twin). The value is the latest forward node, shaped like the
gradient, that every twin reads, directly or through pass-through adds (a
residual stream). Walking those adds anew per term costs the depth of the
stream per term, so the walk is quadratic in depth (cubic along a residual
stream, whose accumulations chain). :class:`CandidateIndex` instead keeps
each node's pass-through closure as a bitset over graph positions, built once
per node; the value is the highest bit of their intersection.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import torch
import torch.fx as fx

from jointlab.meta import KEY, TRAIN_FN

__all__ = ["CandidateIndex", "accumulated_value", "attribute_accumulation", "is_gradient_acc"]

# Forward ops whose backward passes the incoming gradient through unchanged, so
# no backward node of theirs appears between two accumulated contributions.
_PASSTHROUGH = ("add.Tensor", "sub.Tensor", "add_.Tensor")


def is_gradient_acc(node: fx.Node) -> bool:
    """True for the engine's gradient-accumulation add (its ``seq_nr`` is stale)."""
    return bool(node.meta.get("is_gradient_acc"))


def is_passthrough(node: fx.Node) -> bool:
    """True for an add/sub whose backward hands the gradient on without a node of its own."""
    return node.op == "call_function" and str(node.target).endswith(_PASSTHROUGH)


def _contributions(acc: fx.Node) -> list[fx.Node]:
    """The gradient terms an accumulation add sums (through chains of accumulations)."""
    out, todo = [], list(acc.all_input_nodes)
    while todo:
        n = todo.pop()
        (todo.extend(n.all_input_nodes) if is_gradient_acc(n) else out.append(n))
    return out


class CandidateIndex:
    """Pass-through closures of one graph's nodes as bitsets over graph positions.

    Reading a fake tensor's shape is slow while a torch function mode is active
    (the tracer's), so each node's signature is read once. Closures depend on
    the gradient's signature (``want``); each signature keeps its own memo.
    """

    def __init__(self, graph: fx.Graph) -> None:
        """Number the nodes of ``graph``.

        Args:
            graph: The joint graph whose accumulations are attributed.
        """
        self.nodes = list(graph.nodes)
        self.pos = {n: i for i, n in enumerate(self.nodes)}
        self._sigs: dict[fx.Node, Any] = {}
        self._memos: list[tuple[Any, dict[fx.Node, int], dict[fx.Node, int]]] = []

    def sig(self, node: fx.Node) -> Any:
        """``(shape, dtype)`` of the node's tensor value, or None."""
        if node not in self._sigs:
            v = node.meta.get("val")
            self._sigs[node] = (v.shape, v.dtype) if isinstance(v, torch.Tensor) else None
        return self._sigs[node]

    def _memo(self, want: Any) -> tuple[dict[fx.Node, int], dict[fx.Node, int]]:
        for w, reach, cands in self._memos:
            if w == want:
                return reach, cands
        self._memos.append((want, {}, {}))
        return self._memos[-1][1:]

    def _inputs(self, node: fx.Node, want: Any) -> list[fx.Node]:
        return [a for a in node.all_input_nodes if self.sig(a) == want]

    def _reach(self, node: fx.Node, want: Any, reach: dict[fx.Node, int]) -> int:
        """Bitset of ``node`` and, through pass-through adds, the inputs shaped ``want``."""
        stack = [node]
        while stack:  # iterative post-order: a residual stream is deeper than the C stack
            n = stack[-1]
            if n in reach:
                stack.pop()
                continue
            ins = self._inputs(n, want) if is_passthrough(n) else []
            missing = [a for a in ins if a not in reach]
            if missing:
                stack.extend(missing)
                continue
            reach[n] = functools.reduce(operator.or_, (reach[a] for a in ins), 1 << self.pos[n])
            stack.pop()
        return reach[node]

    def candidates(self, twin: fx.Node, want: Any) -> int:
        """Bitset of the forward inputs of ``twin`` shaped ``want``, through pass-through adds."""
        reach, cands = self._memo(want)
        if twin not in cands:
            cands[twin] = functools.reduce(
                operator.or_, (self._reach(a, want, reach) for a in self._inputs(twin, want)), 0)
        return cands[twin]

    def reader(self, twin: fx.Node, bits: int, value: fx.Node, want: Any) -> fx.Node:
        """The node through which ``twin``'s walk reaches ``value`` (``value`` in ``bits``).

        The walk is depth-first from ``twin`` and records the reader of its first
        visit. When only one node can hand ``value`` to it (``twin`` itself or a
        pass-through add in ``bits``), that is the reader; otherwise the walk is
        replayed, skipping everything before ``value`` in graph order (which can
        never lead back to it).
        """
        able = [u for u in value.users
                if u is twin or (is_passthrough(u) and (bits >> self.pos[u]) & 1)]
        return able[0] if len(able) == 1 else self._replay(twin, value, want)

    def _replay(self, twin: fx.Node, value: fx.Node, want: Any) -> fx.Node:
        """The reader of ``value`` on the depth-first walk from ``twin``, from ``value`` up."""
        floor = self.pos[value]
        todo = [(a, twin) for a in self._inputs(twin, want) if self.pos[a] >= floor]
        seen: set[fx.Node] = set()
        while todo:
            n, by = todo.pop()
            if n is value:
                return by
            if n in seen:
                continue
            seen.add(n)
            if is_passthrough(n):
                todo.extend((a, n) for a in self._inputs(n, want) if self.pos[a] >= floor)
        raise AssertionError(f"{value.name} is not reachable from {twin.name}")  # bits lied


def accumulated_value(acc: fx.Node, twins: dict[fx.Node, fx.Node],
                      index: CandidateIndex | None = None
                      ) -> tuple[fx.Node | None, list[fx.Node]]:
    """The forward value whose gradient a gradient-accumulation add sums, and its consumers.

    Each summed term comes from the backward of one consumer of that value (its
    forward twin); the value is the forward input, shaped like the gradient,
    that all those consumers share (looking through pass-through adds, whose
    backward adds no node of its own). Pass-through expansion also admits the
    inputs of the value's own producing add; the value is the latest common
    candidate in graph order.

    Args:
        acc: A node with ``meta["is_gradient_acc"]``.
        twins: The forward twin of each backward node that has one.
        index: Closures shared by all accumulations of the graph (built when None).

    Returns:
        ``(value, consumers)``: one consumer per term (the node that reads the
        value on that term's walk); value is None when no consumer shares one.
    """
    index = CandidateIndex(acc.graph) if index is None else index
    like = acc.meta.get("val")
    want = (like.shape, like.dtype) if isinstance(like, torch.Tensor) else None
    terms = [t for t in (twins.get(c) for c in _contributions(acc)) if t is not None]
    if want is None or not terms:
        return None, []
    per_term = [index.candidates(t, want) for t in terms]
    common = functools.reduce(operator.and_, per_term)
    if not common:
        return None, []
    value = index.nodes[common.bit_length() - 1]
    return value, [index.reader(t, b, value, want) for t, b in zip(terms, per_term)]


def _common_module(consumers: list[fx.Node]) -> tuple[str, str, str] | None:
    """Deepest module holding every consumer: ``(fqn, type, source)``, or None."""
    paths = [c.meta[KEY]["module"] for c in consumers]
    if TRAIN_FN in paths:
        return (TRAIN_FN, "", consumers[paths.index(TRAIN_FN)].meta[KEY]["source"]) \
            if set(paths) == {TRAIN_FN} else None
    parts = [p.split(".") if p else [] for p in paths]
    prefix = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        prefix.append(level[0])
    fqn = ".".join(prefix)
    for c in consumers:
        for path, mtype in (c.meta.get("nn_module_stack") or {}).values():
            if str(path) == fqn:
                name = mtype if isinstance(mtype, str) else getattr(mtype, "__qualname__", "")
                src = next((d.meta[KEY]["source"] for d in consumers
                            if d.meta[KEY]["module"] == fqn), c.meta[KEY]["source"])
                return fqn, name.rsplit(".", 1)[-1], src
    return None


def attribute_accumulation(acc: fx.Node, twins: dict[fx.Node, fx.Node],
                           index: CandidateIndex) -> bool:
    """Give an accumulation add the module where its value is used; False if unknown.

    A parameter or buffer's accumulation belongs to the module owning it (a
    tied weight is used in two modules); a computed value's to the deepest
    module holding all of its consumers (e.g. a block for its residual input).

    Args:
        acc: The accumulation add (already annotated ``phase="backward"``).
        twins: The forward twin of each backward node that has one.
        index: Closures shared by all accumulations of the graph.

    Returns:
        Whether the add was attributed.
    """
    value, consumers = accumulated_value(acc, twins, index)
    if value is None:
        return False
    vmeta = value.meta[KEY]
    if vmeta["phase"] in ("param", "buffer"):
        where = (vmeta["module"], vmeta["module_type"], "")
    else:
        where = _common_module(consumers)
    if where is None:
        return False
    acc.meta[KEY].update(module=where[0], module_type=where[1], source=where[2],
                         grad_acc_of=value.name)
    return True
