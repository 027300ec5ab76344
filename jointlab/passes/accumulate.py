"""Where a gradient-accumulation add belongs: the forward value it sums the gradient of.

Part of the annotation pass (:func:`jointlab.passes.annotate.annotate` calls
:func:`attribute_accumulation`); it writes ``module``, ``module_type``,
``source`` and ``grad_acc_of`` of ``node.meta["jointlab"]`` on the
accumulation adds it can attribute.

Each summed term is the gradient one consumer of the value (the term's forward
twin) sends to one of its inputs. It reaches the value either directly or
through pass-through slots: an add's inputs and a sub's first input, shaped
like its output, get the incoming gradient itself, with no backward node (a
residual stream). A sub's second input gets ``neg`` (a term of its own, whose
twin is the sub), so a twin's term goes to its other slots only. The value is
the latest forward node that every term reaches and that at least two of
those gradient-carrying reads (edges) feed: a value read once is never
accumulated. Walking the slots anew per term costs the depth of the stream
per term, so the walk is quadratic in depth (cubic along a residual stream,
whose accumulations chain). :class:`CandidateIndex` instead keeps each node's
pass-through closure as a bitset over graph positions, built once per node.
"""

from __future__ import annotations

import functools
import operator
from collections import Counter
from typing import Any

import torch
import torch.fx as fx

from jointlab.meta import KEY, TRAIN_FN

__all__ = ["CandidateIndex", "accumulated_value", "attribute_accumulation", "is_gradient_acc"]

# Forward ops whose backward passes the incoming gradient through unchanged, so
# no backward node of theirs appears between two accumulated contributions.
_PASSTHROUGH = ("add.Tensor", "sub.Tensor", "add_.Tensor")
_SUB = "sub.Tensor"


def is_gradient_acc(node: fx.Node) -> bool:
    """True for the engine's gradient-accumulation add (its ``seq_nr`` is stale)."""
    return bool(node.meta.get("is_gradient_acc"))


def is_passthrough(node: fx.Node) -> bool:
    """True for an add/sub whose backward hands the gradient on without a node of its own."""
    return node.op == "call_function" and str(node.target).endswith(_PASSTHROUGH)


def _contributions(acc: fx.Node, memo: dict[fx.Node, tuple[list, list]] | None = None
                   ) -> tuple[list[fx.Node], list[fx.Node]]:
    """The gradient terms an accumulation add sums, and the accumulations it sums them through.

    ``memo`` keeps each add's answer: a chain of k adds summing one value (a tensor
    every layer reads) is then walked once, not k times (quadratic in depth).
    Callers never change the lists.
    """
    hit = memo.get(acc) if memo is not None else None
    if hit is not None:
        return hit
    out, inner, todo = [], [], list(acc.all_input_nodes)
    while todo:
        n = todo.pop()
        if not is_gradient_acc(n):
            out.append(n)
            continue
        inner.append(n)
        known = memo.get(n) if memo is not None else None
        if known is None:
            todo.extend(n.all_input_nodes)
        else:  # n's own terms and inner adds, as walking its inputs would find them
            out.extend(known[0])
            inner.extend(known[1])
    if memo is not None:
        memo[acc] = (out, inner)
    return out, inner


def _slots(user: fx.Node, value: fx.Node) -> list[int]:
    """Where ``user`` reads ``value``: positional indices, -1 for each other read."""
    direct = [i for i, a in enumerate(user.args) if a is value]
    reads: list[fx.Node] = []
    fx.node.map_arg((user.args, user.kwargs), lambda n: reads.append(n) or n)
    return direct + [-1] * (sum(n is value for n in reads) - len(direct))


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
        #: Each accumulation add's terms and inner adds (:func:`_contributions`).
        self.contributions: dict[fx.Node, tuple[list, list]] = {}

    def sig(self, node: fx.Node) -> Any:
        """``(shape, dtype)`` of the node's tensor value, or None."""
        if node not in self._sigs:
            v = node.meta.get("val")
            self._sigs[node] = (v.shape, v.dtype) if isinstance(v, torch.Tensor) else None
        return self._sigs[node]

    def hands_on(self, node: fx.Node, slot: int) -> bool:
        """True when ``node``'s backward gives input ``slot`` its own incoming gradient.

        That is an add's inputs (alpha 1) and a sub's first input, when shaped
        like the output (else the backward reduces or casts: a node of its own).
        """
        if not is_passthrough(node) or slot not in (0, 1) or slot >= len(node.args):
            return False
        if slot == 1 and (str(node.target).endswith(_SUB) or node.kwargs.get("alpha", 1) != 1):
            return False
        arg = node.args[slot]
        return isinstance(arg, fx.Node) and self.sig(arg) == self.sig(node)

    def _memo(self, want: Any) -> tuple[dict[fx.Node, int], dict[fx.Node, int]]:
        for w, reach, cands in self._memos:
            if w == want:
                return reach, cands
        self._memos.append((want, {}, {}))
        return self._memos[-1][1:]

    def _handed(self, node: fx.Node, want: Any) -> list[fx.Node]:
        """The inputs shaped ``want`` that ``node``'s incoming gradient reaches unchanged."""
        return [node.args[i] for i in (0, 1) if self.hands_on(node, i)
                and self.sig(node.args[i]) == want]

    def _reach(self, node: fx.Node, want: Any, reach: dict[fx.Node, int]) -> int:
        """Bitset of ``node`` and the nodes its gradient reaches through pass-through slots."""
        stack = [node]
        while stack:  # iterative post-order: a residual stream is deeper than the C stack
            n = stack[-1]
            if n in reach:
                stack.pop()
                continue
            ins = self._handed(n, want)
            missing = [a for a in ins if a not in reach]
            if missing:
                stack.extend(missing)
                continue
            reach[n] = functools.reduce(operator.or_, (reach[a] for a in ins), 1 << self.pos[n])
            stack.pop()
        return reach[node]

    def candidates(self, twin: fx.Node, want: Any) -> int:
        """Bitset of the nodes a gradient shaped ``want`` that ``twin`` sends can reach.

        Those are ``twin``'s inputs shaped ``want`` at slots that are not pass-through
        (its backward computes their terms), and their pass-through closures.
        """
        reach, cands = self._memo(want)
        if twin not in cands:
            cands[twin] = functools.reduce(
                operator.or_, (self._reach(a, want, reach) for a in self._sent(twin, want)), 0)
        return cands[twin]

    def _sent(self, twin: fx.Node, want: Any) -> list[fx.Node]:
        """The inputs shaped ``want`` that ``twin``'s backward computes a term for."""
        direct = [a for i, a in enumerate(twin.args) if isinstance(a, fx.Node)
                  and self.sig(a) == want and not self.hands_on(twin, i)]
        return direct + [a for a in twin.all_input_nodes
                         if a not in twin.args and self.sig(a) == want]

    def edges(self, value: fx.Node, flowing: int, twins: set[fx.Node]) -> list[fx.Node]:
        """The reads of ``value`` that can carry one of the terms (one entry per read).

        A pass-through slot carries a term when its reader is in ``flowing`` (the
        union of the terms' candidates); any other slot when its reader is a twin.
        """
        out = []
        for user in value.users:
            for slot in _slots(user, value):
                if (((flowing >> self.pos[user]) & 1) if self.hands_on(user, slot)
                        else user in twins):
                    out.append(user)
        return out


def accumulated_value(acc: fx.Node, twins: dict[fx.Node, fx.Node],
                      index: CandidateIndex | None = None
                      ) -> tuple[fx.Node | None, list[fx.Node]]:
    """The forward value whose gradient a gradient-accumulation add sums, and its consumers.

    The value is the latest node that every term can reach (:meth:`CandidateIndex.
    candidates`) with enough reads carrying terms (:meth:`CandidateIndex.edges`):
    two, plus one per inner accumulation already attributed to it (the earlier
    links of a chain summing three or more terms into the same value).

    Args:
        acc: A node with ``meta["is_gradient_acc"]``.
        twins: The forward twin of each backward node that has one.
        index: Closures shared by all accumulations of the graph (built when None).

    Returns:
        ``(value, consumers)``: the nodes whose reads of the value carry its
        terms, in graph order; value is None when no node fits.
    """
    index = CandidateIndex(acc.graph) if index is None else index
    like = acc.meta.get("val")
    want = (like.shape, like.dtype) if isinstance(like, torch.Tensor) else None
    found, inner = _contributions(acc, index.contributions)
    terms = [t for t in (twins.get(c) for c in found) if t is not None]
    if want is None or not terms:
        return None, []
    per_term = [index.candidates(t, want) for t in terms]
    common = functools.reduce(operator.and_, per_term)
    flowing = functools.reduce(operator.or_, per_term)
    earlier = Counter(a.meta.get(KEY, {}).get("grad_acc_of") for a in set(inner))
    twinned = set(terms)
    while common:
        top = common.bit_length() - 1
        value = index.nodes[top]
        readers = index.edges(value, flowing, twinned)
        if len(readers) >= 2 + earlier[value.name]:
            return value, sorted(set(readers), key=index.pos.__getitem__)
        common ^= 1 << top
    return None, []


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
    When three or more terms are summed by a chain of adds, the last one sees
    every consumer: the earlier links of the chain get its placement too.

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
    chain = [a for a in _contributions(acc, index.contributions)[1]
             if a.meta[KEY].get("grad_acc_of") == value.name]
    for node in (*chain, acc):
        node.meta[KEY].update(module=where[0], module_type=where[1], source=where[2],
                              grad_acc_of=value.name)
    return True
