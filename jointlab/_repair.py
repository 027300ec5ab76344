"""Make traced views safe where fake strides may differ from real ones.

A trace sees fake tensors, whose strides come from meta kernels. For a few
ops the real CPU kernel lays out its output differently: on torch 2.13,
``native_batch_norm`` (and its backward) returns a contiguous tensor for a
transposed input, while the meta kernel keeps the input's strides. A later
``aten.view`` that is legal on the fake strides then fails on the real
tensor ("view size is not compatible with input tensor's size and stride"),
where eager PyTorch had used ``reshape``.

:func:`repair_views` follows values whose strides are uncertain (outputs of
those ops, and whatever views, pointwise ops and copies derive from them) and
turns each ``aten.view`` on such a value into ``aten.reshape``: a view where
the real layout allows one, a copy where it does not, as in eager.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

aten = torch.ops.aten

#: Ops whose real CPU output strides can differ from their meta kernel's.
STRIDE_UNCERTAIN = {
    aten.native_batch_norm.default,
    aten.native_batch_norm_backward.default,
    aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit_functional.default,
    aten._native_batch_norm_legit_no_training.default,
}


def makes_uncertain(node: fx.Node) -> bool:
    """True for an op whose output strides may differ between fake and real."""
    return node.op == "call_function" and node.target in STRIDE_UNCERTAIN


def keeps_layout(node: fx.Node) -> bool:
    """True for ops whose output layout follows their input's (views, pointwise, copies)."""
    if node.op != "call_function":
        return False
    t = node.target
    if t is operator.getitem:
        return True
    if not isinstance(t, torch._ops.OpOverload):
        return False
    name = t._schema.name.split("::")[-1]
    return t.is_view or torch.Tag.pointwise in t.tags or name in ("clone", "_to_copy", "detach")


def is_view_op(node: fx.Node) -> bool:
    """True for ``aten.view.default``."""
    return node.op == "call_function" and node.target is aten.view.default


def repair_views(gm: fx.GraphModule) -> int:
    """Turn ``view`` into ``reshape`` on values whose real strides are uncertain.

    Args:
        gm: A traced graph module; edited in place and recompiled if changed.

    Returns:
        How many nodes were changed.
    """
    uncertain: set[fx.Node] = set()
    changed = 0
    for node in gm.graph.nodes:
        if makes_uncertain(node):
            uncertain.add(node)
            continue
        if not any(a in uncertain for a in node.all_input_nodes):
            continue
        if is_view_op(node):
            node.target = aten.reshape.default
            changed += 1
        if keeps_layout(node) or node.target is aten.reshape.default:
            uncertain.add(node)
    if changed:
        gm.recompile()
    return changed
