"""Which nodes of a joint graph may hold an additive attention mask's ``-inf``.

A mask built from a ``-inf`` fill holds infinities by design; ``jl.record``
marks such a value (its ``mask`` column) instead of counting it as a numerical
problem. :func:`mask_nodes` states the static rule, :func:`mask_sums` finds
``scores + mask``; the observer (:mod:`jointlab.analysis.observer`) checks the
values at run time.
"""

from __future__ import annotations

import math
from typing import Any

import torch.fx as fx

from jointlab.meta import op_name

__all__ = ["mask_nodes", "mask_sums"]

#: Ops that build an additive attention mask from a ``-inf`` fill value (a literal
#: ``-inf`` argument, or a ``-inf`` scalar node that ``where`` selects from).
_MASK_FILL = frozenset({"scalar_tensor", "full", "full_like", "new_full", "fill", "fill_",
                        "masked_fill", "masked_fill_", "where", "lift_fresh_copy"})
#: Ops that carry a mask's values over unchanged (rearranged, selected, repeated).
_MASK_CARRY = frozenset({"view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose",
                         "permute", "unsqueeze", "squeeze", "alias", "detach", "clone",
                         "contiguous", "view_as", "flatten", "unflatten", "movedim", "expand",
                         "slice", "select", "cat", "repeat", "_to_copy", "to"})


def mask_nodes(nodes: list[fx.Node]) -> list[bool]:
    """Per node: whether its ``-inf`` values, if any, are an attention mask's.

    The rule: a node is a mask when it fills with ``-inf`` (an op of
    :data:`_MASK_FILL` with a literal ``-inf`` argument, or a ``where``/fill
    whose value argument is such a node), or carries a mask's values over
    unchanged (:data:`_MASK_CARRY` of a mask node). At run time its value counts
    as a mask only when every non-finite element is exactly ``-inf`` (a NaN or a
    ``+inf`` is reported as a numerical problem). Arithmetic on a mask (scores +
    mask) is not a mask: its ``-inf`` are counted. A mask filled with the
    dtype's min (``torch.finfo(dtype).min``, what HF uses in eager attention) is
    finite and never counted.

    Args:
        nodes: The graph's nodes in order.

    Returns:
        One flag per node.
    """
    out: dict[fx.Node, bool] = {}
    for n in nodes:
        name = op_name(n) if n.op == "call_function" else ""
        flat: list[Any] = []
        fx.node.map_aggregate((n.args, n.kwargs), flat.append)
        from_mask = any(isinstance(a, fx.Node) and out.get(a, False) for a in flat)
        if name in _MASK_FILL:
            out[n] = from_mask or any(isinstance(a, float) and a == -math.inf for a in flat)
        else:
            out[n] = name in _MASK_CARRY and from_mask
    return [out[n] for n in nodes]


def mask_sums(nodes: list[fx.Node], maskable: list[bool]) -> list[int]:
    """Per node: for ``scores + mask`` (``add`` of exactly one mask node), the mask's index.

    Such a sum is a mask when its ``-inf`` are exactly the mask's, broadcast
    (the observer compares the counts).

    Args:
        nodes: The graph's nodes in order.
        maskable: :func:`mask_nodes` of ``nodes``.

    Returns:
        Per node the index of the mask it adds, or -1.
    """
    index = {n: i for i, n in enumerate(nodes)}
    out = [-1] * len(nodes)
    for i, n in enumerate(nodes):
        if n.op == "call_function" and op_name(n) in ("add", "add_") and len(n.args) >= 2:
            masks = [index[a] for a in n.args[:2] if isinstance(a, fx.Node) and maskable[index[a]]]
            if len(masks) == 1:
                out[i] = masks[0]
    return out
