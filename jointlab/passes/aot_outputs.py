"""An AOT joint graph's outputs and their descriptors, rewritten together.

The AOT export describes each output of its joint graph by a descriptor
(``PlainAOTOutput``, ``GradAOTOutput``, ``InputMutationAOTOutput``, ...) in
the output node's ``meta["desc"]`` list, one per output value, in order. When
the AOT tracing mode decides a new output list (a tied weight's alias
gradients reordered so the runtime sums them as eager does,
:mod:`jointlab.trace.aot_plan`; a DTensor's opaque parts dropped,
:mod:`jointlab.trace.aot_subclass`), it hands the values and descriptors to
:func:`replace_outputs`, which writes both, so they never fall out of step.

Meta keys written (on the output node, torch's own key, not under
``meta["jointlab"]``):

- ``desc``: the descriptor of each output value, in output order.
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx

__all__ = ["replace_outputs"]


def replace_outputs(gm: fx.GraphModule, args: tuple[Any, ...], descs: list[Any]) -> None:
    """Set the output node's args and its ``meta["desc"]`` in one step.

    Args:
        gm: The AOT joint graph; edited in place (the caller recompiles).
        args: The output node's new args (the output values first).
        descs: The descriptor of each output value, in the same order.
    """
    out = gm.graph.output_node()
    out.args = args
    out.meta["desc"] = descs
