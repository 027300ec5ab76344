"""Make traced views safe where fake strides may differ from real ones.

A trace sees fake tensors, whose strides come from meta kernels. For a few
ops the real CPU kernel lays out its output differently: on torch 2.13,
``native_batch_norm`` (and its backward) returns a contiguous tensor for a
transposed input, while the meta kernel keeps the input's strides; so can
``native_dropout`` (and its backward) in a dynamic trace. A later
``aten.view`` that is legal on the fake strides then fails on the real
tensor ("view size is not compatible with input tensor's size and stride"),
where eager PyTorch had used ``reshape``.

Inductor re-traces the graph under its own decompositions, which can lay a
value out differently again: its ``aten.cat`` decomposition drops the legacy
empty 1-D inputs that ``cat`` skips (HF's KV cache concatenates the new keys
onto such an empty constant when ``use_cache`` is on) and, when one input is
left, returns ``input.clone()``, which keeps that input's (transposed)
strides where the traced ``cat`` was contiguous. A traced ``view`` of the
keys then fails when Inductor compiles the graph. Such a ``cat``
(:func:`relaid_by_inductor`) starts an uncertain value too.

:func:`repair_views` follows values whose strides are uncertain (outputs of
those ops, and what is derived from them) and
turns each ``aten.view`` on such a value into ``aten.reshape``: a view where
the real layout allows one, a copy where it does not, as in eager. Uncertainty
flows through every op except those that lay out their output afresh (matrix
products); most ops (pointwise, dropout, copies, views) follow their input's
strides.

Meta keys written: none. It edits node targets only, and runs inside
:func:`jointlab.trace` before the analysis pass reads the graph.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from jointlab.torch_compat import batch_norm_legit_overloads

aten = torch.ops.aten

#: Ops whose real CPU output strides can differ from their meta kernel's.
STRIDE_UNCERTAIN = {
    aten.native_batch_norm.default,
    aten.native_batch_norm_backward.default,
    *batch_norm_legit_overloads(),
    # Dynamic make_fx traces run under the Python dispatcher, where dropout's
    # fake output strides come from its decomposition, not the CPU kernel.
    aten.native_dropout.default,
    aten.native_dropout_backward.default,
}


def makes_uncertain(node: fx.Node) -> bool:
    """True for an op whose output strides may differ between fake and real."""
    return node.op == "call_function" and node.target in STRIDE_UNCERTAIN


def _is_skipped_empty(arg: object) -> bool:
    """True for a 1-D, zero-element value, which ``aten.cat`` skips (legacy behaviour)."""
    val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dim() == 1 and val.shape[0] == 0


def relaid_by_inductor(node: fx.Node) -> bool:
    """True for a ``cat`` with a skipped empty input: Inductor's decomposition may relay it out."""
    if node.op != "call_function" or node.target is not aten.cat.default:
        return False
    tensors = node.args[0] if node.args else ()
    return isinstance(tensors, (list, tuple)) and any(_is_skipped_empty(a) for a in tensors)


#: Ops whose outputs are freshly laid out (contiguous) in both fake and real runs.
FRESH_LAYOUT = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}


def resets_layout(node: fx.Node) -> bool:
    """True for ops whose output strides do not depend on their inputs' strides."""
    return node.op == "call_function" and node.target in FRESH_LAYOUT


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
        if makes_uncertain(node) or relaid_by_inductor(node):
            uncertain.add(node)
            continue
        if not any(a in uncertain for a in node.all_input_nodes):
            continue
        if is_view_op(node):
            node.target = aten.reshape.default
            changed += 1
        if not resets_layout(node):
            uncertain.add(node)
    if changed:
        gm.recompile()
    return changed
