"""The annotation pass: phase, module attribution and source of every node.

One pass serves both tracing modes (:func:`annotate`); what differs between
them (which placeholder is what, which node is backward, which output is
which gradient) comes in as :class:`ModeRules` from
:mod:`jointlab.passes.classify`. It runs once, inside :func:`jointlab.trace`,
and writes the trace-time keys of ``node.meta["jointlab"]`` listed in
:func:`annotate` (see also :mod:`jointlab.meta`). Node kinds are told apart by
the small predicates below; everything is one or two linear passes (gradient-
accumulation adds are placed by :mod:`jointlab.passes.accumulate`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch.fx as fx

from jointlab.meta import KEY, RECOMPUTE_TAG, TRAIN_FN
from jointlab.passes.accumulate import CandidateIndex, attribute_accumulation, is_gradient_acc
from jointlab.sources import innermost_user_frame, stack_trace_frames, user_source

_COPIED_META = ("nn_module_stack", "stack_trace", "custom")


# -- predicates ---------------------------------------------------------------
def is_placeholder(node: fx.Node) -> bool:
    """True for a graph input."""
    return node.op == "placeholder"


def is_output(node: fx.Node) -> bool:
    """True for the graph's output node."""
    return node.op == "output"


def is_compute(node: fx.Node) -> bool:
    """True for nodes that compute something (calls and attribute reads)."""
    return node.op in ("call_function", "call_method", "call_module", "get_attr")


def is_engine_backward(node: fx.Node) -> bool:
    """True when the autograd engine tagged the node as part of backward."""
    return bool(node.meta.get("autograd_backward"))


def is_checkpoint_recompute(node: fx.Node) -> bool:
    """True when the node was created by a checkpoint recompute (tagged by passes.recompute)."""
    return bool(node.meta.get(RECOMPUTE_TAG))


def has_module_stack(node: fx.Node) -> bool:
    """True when make_fx recorded the module whose forward created the node."""
    return bool(node.meta.get("nn_module_stack"))


# -- helpers ------------------------------------------------------------------
def node_inputs(node: fx.Node) -> Iterable[fx.Node]:
    """Nodes read by ``node`` (deduplicated, in argument order)."""
    return node.all_input_nodes


def stack_module(node: fx.Node) -> tuple[str, str]:
    """Module FQN and class name from ``nn_module_stack`` (``<train_fn>`` when empty)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return TRAIN_FN, ""
    path, mtype = next(reversed(stack.values()))
    name = mtype if isinstance(mtype, str) else getattr(mtype, "__qualname__", str(mtype))
    return str(path), name.rsplit(".", 1)[-1]


# -- the pass -----------------------------------------------------------------
_BLANK = {"module": "", "module_type": "", "source": ""}


class ModeRules(Protocol):
    """The only parts of the annotation that differ between the tracing modes.

    :mod:`jointlab.passes.classify` has the two implementations.
    """

    def placeholder_info(self, node: fx.Node) -> dict[str, Any]:
        """Trace-time facts of a placeholder (``phase`` and ``fqn`` or ``input_path``)."""

    def is_backward(self, node: fx.Node) -> bool:
        """Whether a compute node belongs to the backward; called once per node, in order."""

    def gradients(self, out: fx.Node) -> list[tuple[str, Any, bool]]:
        """``(parameter FQN, gradient output value, only zeros)`` for each gradient output."""

    def input_gradients(self, out: fx.Node) -> list[tuple[str, Any, bool]]:
        """``(input path, gradient output value, only zeros)`` for each input gradient."""


def annotate(gm: fx.GraphModule, rules: ModeRules) -> None:
    """Write phase, module, type and source for every node of a joint graph (both modes).

    Writes into ``node.meta["jointlab"]``: ``phase``, ``module``, ``module_type``,
    ``source`` on every node; ``fqn`` / ``input_path`` on placeholders;
    ``fwd_twin`` on backward nodes attributed through ``seq_nr``; ``grad_acc_of``
    on attributed gradient-accumulation adds; ``grad_of`` and ``zero_grad`` on
    gradient outputs; ``input_grad_of`` (and ``zero_grad``) on input-gradient
    outputs; ``recompute`` on every node. Also copies ``nn_module_stack``,
    ``stack_trace`` and ``custom`` from each forward twin onto its backward nodes
    (top-level ``node.meta``, as make_fx itself would).

    Args:
        gm: The joint graph.
        rules: The mode's classification (:mod:`jointlab.passes.classify`).
    """
    graph = gm.graph
    by_seq: dict[int, fx.Node] = {}
    pending: list[fx.Node] = []
    for node in graph.nodes:
        if is_placeholder(node):
            node.meta[KEY] = {**_BLANK, **rules.placeholder_info(node)}
            continue
        if is_output(node):
            node.meta[KEY] = {**_BLANK, "phase": "output"}
            continue
        if rules.is_backward(node):
            pending.append(node)
            continue
        mod, mtype = stack_module(node)
        node.meta[KEY] = {"phase": "forward", "module": mod, "module_type": mtype,
                          "source": user_source(node.meta.get("stack_trace"))}
        seq = node.meta.get("seq_nr")
        if seq is not None and seq >= 0:
            by_seq.setdefault(seq, node)
    grads = rules.gradients(graph.output_node())
    _own_zero_grads(graph, grads)
    attribute_backward(pending, by_seq)
    _mark_gradients(grads)
    _mark_gradients(rules.input_gradients(graph.output_node()), key="input_grad_of")
    _copy_into_subgraphs(gm, by_seq)
    mark_recompute(graph)


def mark_recompute(graph: fx.Graph) -> None:
    """Write the ``recompute`` flag on every annotated node of ``graph``."""
    for node in graph.nodes:
        meta = node.meta.get(KEY)
        if meta is not None:
            meta["recompute"] = meta["phase"] == "backward" and is_checkpoint_recompute(node)


def _copy_into_subgraphs(gm: fx.GraphModule, by_seq: dict[int, fx.Node]) -> None:
    # Higher-order ops (e.g. checkpointed regions) keep their own subgraphs;
    # their backward nodes get the module metadata of their forward twin too.
    for sub in gm.modules():
        if sub is gm or not isinstance(sub, fx.GraphModule):
            continue
        for node in sub.graph.nodes:
            twin = by_seq.get(node.meta.get("seq_nr", -1))
            if twin is not None and is_engine_backward(node):
                for key in _COPIED_META:
                    if twin.meta.get(key) is not None:
                        node.meta[key] = twin.meta[key]


def attribute_backward(nodes: list[fx.Node], by_seq: dict[int, fx.Node]) -> None:
    """Give backward nodes the module, stack and source of their forward twin.

    Args:
        nodes: Backward nodes, in graph order.
        by_seq: The first forward node of each ``seq_nr``.
    """
    unresolved, twins = [], {}
    for node in nodes:
        if KEY in node.meta:  # already attributed (zeros for unused parameters)
            continue
        if is_checkpoint_recompute(node) and has_module_stack(node):
            _own_module(node, by_seq)  # a recomputed forward op: the module running it again
            continue
        # Only the engine's own backward ops carry the seq_nr of the forward op they
        # differentiate. A gradient-accumulation add, and an untagged node (the
        # ones_like seed), carry whatever seq_nr was current: resolve them below.
        twin = (by_seq.get(node.meta.get("seq_nr", -1))
                if is_engine_backward(node) and not is_gradient_acc(node) else None)
        meta = {"phase": "backward", "module": "", "module_type": "", "source": ""}
        node.meta[KEY] = meta
        if twin is None:
            unresolved.append(node)
            continue
        for key in _COPIED_META:
            if key in twin.meta and twin.meta[key] is not None:
                node.meta[key] = twin.meta[key]
        twins[node] = twin
        tmeta = twin.meta[KEY]
        meta.update(module=tmeta["module"], module_type=tmeta["module_type"],
                    source=tmeta["source"], fwd_twin=twin.name)
    # Nodes without a forward twin (gradient seeds, accumulation, zeros for
    # unused parameters) take the module of their nearest attributed neighbour:
    # first a producer, then (walking back) a consumer.
    # An attributed accumulation keeps its module even when that is the root ("").
    index = CandidateIndex(nodes[0].graph) if nodes else None  # shared by all accumulations
    placed = set()
    for node in unresolved:
        if is_gradient_acc(node) and attribute_accumulation(node, twins, index):
            placed.add(node)
            continue
        _inherit(node, node_inputs(node))
    unresolved = [node for node in unresolved if node not in placed]
    for node in reversed(unresolved):
        if not node.meta[KEY]["module"]:
            _inherit(node, node.users)
    for node in unresolved:
        if not node.meta[KEY]["module"]:
            node.meta[KEY]["module"] = TRAIN_FN


def _own_module(node: fx.Node, by_seq: dict[int, fx.Node]) -> None:
    # The recompute's stack starts in the engine: without a user frame of its
    # own, its source is that of the checkpointed forward op whose backward ran it.
    mod, mtype = stack_module(node)
    source = user_source(node.meta.get("stack_trace"))
    if innermost_user_frame(stack_trace_frames(node.meta.get("stack_trace"))) is None:
        twin = by_seq.get(node.meta.get("seq_nr", -1))
        source = twin.meta[KEY]["source"] if twin is not None else ""
    node.meta[KEY] = {"phase": "backward", "module": mod, "module_type": mtype,
                      "source": source}


def _inherit(node: fx.Node, neighbours: Iterable[fx.Node]) -> None:
    for other in neighbours:
        ometa = other.meta.get(KEY)
        if ometa and ometa["phase"] in ("forward", "backward") and ometa["module"]:
            node.meta[KEY].update(module=ometa["module"], module_type=ometa["module_type"],
                                  source=ometa["source"])
            return


def _own_zero_grads(graph: fx.Graph, grads: list[tuple[str, Any, bool]]) -> None:
    # Zeros emitted for a parameter without a gradient belong to the module
    # that owns the parameter.
    owners = {n.meta[KEY].get("fqn"): n.meta[KEY] for n in graph.find_nodes(op="placeholder")}
    for fqn, node, zero in grads:
        if zero and isinstance(node, fx.Node) and KEY not in node.meta:
            p = owners.get(fqn, {})
            node.meta[KEY] = {"phase": "backward", "module": p.get("module", ""),
                              "module_type": p.get("module_type", ""), "source": ""}


def _mark_gradients(grads: list[tuple[str, Any, bool]], key: str = "grad_of") -> None:
    for fqn, node, zero in grads:
        if isinstance(node, fx.Node) and KEY in node.meta:
            node.meta[KEY][key] = fqn
            if zero:
                node.meta[KEY]["zero_grad"] = True
