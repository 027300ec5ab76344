"""Deliberate Inductor bugs for the held-out suite: wrong lowerings and a wrong decomposition.

Three kinds, each a scale of 1.001 (a compiler bug of one part in a thousand):

* ``forward lowering``: the lowering of the first forward post-grad node that
  holds the result of a chosen op (``gelu``, ``relu``...; the node Inductor's
  decompositions derived from it that a node of another op reads), so the op's
  whole output is 1.001 times too large.
* ``backward lowering``: the same for the first backward post-grad node holding
  a chosen backward op's result (``gelu_backward``, ``threshold_backward``...);
  the forward is untouched.
* ``decomposition``: Inductor's decomposition of a chosen op (its first tensor
  output scaled), before any lowering.

Every lowering is wrapped while the graph compiles; the wrapper scales the
result of the node it was asked for only, and records that post-grad node's
name (the ground truth the bench checks the named kernel against). The patch
is undone on leaving the context, whatever happens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from jointlab import torch_compat

aten = torch.ops.aten
SCALE = 1.001

#: Ops whose first derived post-grad node gets a wrong lowering, in order of preference.
FORWARD_OPS = ("gelu", "silu", "relu", "sigmoid", "tanh", "_softmax")
BACKWARD_OPS = ("gelu_backward", "silu_backward", "threshold_backward", "sigmoid_backward",
                "tanh_backward", "_softmax_backward_data")
#: Ops whose Inductor decomposition is made wrong, in order of preference.
DECOMPOSED_OPS = ("gelu", "silu", "native_layer_norm_backward", "native_batch_norm_backward",
                  "sigmoid_backward", "tanh_backward", "_softmax_backward_data",
                  "_log_softmax_backward_data")


@dataclass
class Injected:
    """What a bug changed: the op it targets and the post-grad nodes it scaled."""

    kind: str
    op: Any
    scaled: list[str] = field(default_factory=list)


def _packet(name: str) -> Any:
    return getattr(aten, name).default


def pick(traced_targets: set[Any], names: tuple[str, ...], table: Any = None) -> Any:
    """The first op of ``names`` the traced graph calls (and ``table`` holds), else None.

    An in-place call (``sigmoid_``) counts for its op: functionalization makes it one.
    """
    called = {str(t) for t in traced_targets}
    for name in names:
        op = _packet(name)
        if {str(op), f"aten.{name}_.default"} & called and (table is None or op in table):
            return op
    return None


def _is_float(val: Any) -> bool:
    return isinstance(val, torch.Tensor) and val.is_floating_point()


def _computes(node: Any) -> bool:
    """True for a node computed from a float tensor (not a constant such as ``full``'s 0)."""
    return any(_is_float(getattr(a, "meta", {}).get("val")) for a in node.all_input_nodes)


def _is_result(node: Any) -> bool:
    """True for the post-grad node holding its op's result: read outside that op's nodes."""
    op = str(node.meta.get("original_aten"))
    return any(u.op == "output" or str(u.meta.get("original_aten")) != op for u in node.users)


def _is_float_box(out: Any) -> bool:
    get = getattr(out, "get_dtype", None)
    return get is not None and get().is_floating_point


@contextlib.contextmanager
def wrong_lowering(op: Any, backward: bool) -> Iterator[Injected]:
    """Scale the lowering of the first post-grad node derived from ``op`` in one phase.

    Args:
        op: The traced op (``aten.gelu.default``) whose derived nodes are candidates.
        backward: Pick a backward node (``autograd_backward`` in its meta) or a forward one.

    Yields:
        An :class:`Injected` whose ``scaled`` lists the post-grad node it scaled.
    """
    lowering = torch_compat.torch_module("torch._inductor.lowering", "inject a wrong lowering")
    graph_v = torch_compat.torch_module("torch._inductor.virtualized", "inject").V
    mul = lowering.lowerings[aten.mul.Tensor]
    done = Injected("backward lowering" if backward else "forward lowering", op)
    saved = dict(lowering.lowerings)

    def wants(key: Any) -> Any:
        node = graph_v.graph.current_node
        if done.scaled or node is None or node.target is not key:
            return None
        meta = node.meta
        val = meta.get("val")
        return node if (str(meta.get("original_aten")) == str(op)
                        and bool(meta.get("autograd_backward")) == backward
                        and _is_float(val) and _computes(node) and _is_result(node)) else None

    def wrap(key: Any, base: Any) -> Any:
        def lowered(*args: Any, **kwargs: Any) -> Any:
            out = base(*args, **kwargs)
            node = wants(key)
            if node is not None and _is_float_box(out):
                done.scaled.append(node.name)
                return mul(out, SCALE)
            return out
        return lowered

    lowering.lowerings.update({k: wrap(k, v) for k, v in saved.items()})
    try:
        yield done
    finally:
        lowering.lowerings.clear()
        lowering.lowerings.update(saved)


def _scaled_first(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out * SCALE
    out = list(out)
    i = next(i for i, v in enumerate(out) if isinstance(v, torch.Tensor))
    out[i] = out[i] * SCALE
    return tuple(out)


@contextlib.contextmanager
def wrong_decomposition(op: Any) -> Iterator[Injected]:
    """Scale the first tensor output of Inductor's decomposition of ``op`` by 1.001.

    Yields:
        An :class:`Injected` (``scaled`` stays empty: the op's traced nodes are the truth).
    """
    decomp = torch_compat.torch_module("torch._inductor.decomposition", "inject a wrong one")
    base = decomp.decompositions[op]
    decomp.decompositions[op] = lambda *a, **k: _scaled_first(base(*a, **k))
    try:
        yield Injected("decomposition", op)
    finally:
        decomp.decompositions[op] = base
