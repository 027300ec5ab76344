"""What the annotation pass needs to know per tracing mode, and nothing else.

:func:`jointlab.passes.annotate.annotate` is one pass for both modes; the
:class:`~jointlab.passes.annotate.ModeRules` here tell it, per mode, what
each placeholder is, which compute node belongs to the backward, and which
output is which parameter's gradient. Neither class writes ``node.meta``;
the AOT rules get the facts :mod:`jointlab.trace.aot` read from the
export's descriptors, so this module never imports the exporter.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch.fx as fx

from jointlab.passes.annotate import has_module_stack, is_compute, is_engine_backward, node_inputs

__all__ = ["AotRules", "MakeFxRules", "forward_ancestors"]


def forward_ancestors(roots: Sequence[Any]) -> set[fx.Node]:
    """Every compute node that ``roots`` (the loss, the loss_dict values) depend on."""
    seen: set[fx.Node] = set()
    todo = [r for r in roots if isinstance(r, fx.Node) and is_compute(r)]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        todo.extend(a for a in node_inputs(n) if is_compute(a) and a not in seen)
    return seen


class MakeFxRules:
    """The default mode: outputs laid out as ``[loss, *grads, *input grads, *loss_dict]``.

    A node is backward when the engine tagged it, or when it comes after the
    loss, outside any module, and the loss does not depend on it (the
    gradient seed, zeros for unused parameters). Untagged nodes before the
    loss (saved-tensor detaches, spare multi-output getitems) are forward.
    """

    def __init__(self, gm: fx.GraphModule, placeholder_info: Sequence[dict[str, Any]],
                 grad_fqns: Sequence[str], zero_grad_fqns: Iterable[str] = (),
                 num_loss_dict: int = 0, input_grad_paths: Sequence[str] = (),
                 zero_input_paths: Iterable[str] = ()) -> None:
        """Read the output layout of ``gm``.

        Args:
            gm: The make_fx joint graph.
            placeholder_info: Per placeholder in order, its trace-time facts.
            grad_fqns: The parameter FQN of each gradient output.
            zero_grad_fqns: Parameters whose gradient output is only zeros.
            num_loss_dict: How many ``loss_dict`` values follow the gradients.
            input_grad_paths: The input path of each input-gradient output (after the
                parameters' gradients).
            zero_input_paths: Inputs whose gradient output is only zeros.
        """
        outs = list(gm.graph.output_node().args[0])
        self._placeholders = iter(placeholder_info)
        self._ancestors = forward_ancestors([outs[0], *outs[len(outs) - num_loss_dict:]])
        self._loss = outs[0] if isinstance(outs[0], fx.Node) else None
        self._after_loss = False
        zero = set(zero_grad_fqns)
        self._grads = [(f, n, f in zero) for f, n in zip(grad_fqns, outs[1:1 + len(grad_fqns)])]
        zero_in, start = set(zero_input_paths), 1 + len(grad_fqns)
        self._input_grads = [(p, n, p in zero_in) for p, n in
                             zip(input_grad_paths, outs[start:start + len(input_grad_paths)])]

    def placeholder_info(self, node: fx.Node) -> dict[str, Any]:
        """The next placeholder's facts, in graph order."""
        return dict(next(self._placeholders))

    def is_backward(self, node: fx.Node) -> bool:
        """Engine-tagged, or after the loss outside modules and not feeding it."""
        backward = is_engine_backward(node) or (
            self._after_loss and not (has_module_stack(node) or node in self._ancestors))
        self._after_loss = self._after_loss or node is self._loss
        return backward

    def gradients(self, out: fx.Node) -> list[tuple[str, Any, bool]]:
        """Each gradient output with its parameter and whether it is zeros only."""
        return self._grads

    def input_gradients(self, out: fx.Node) -> list[tuple[str, Any, bool]]:
        """Each input-gradient output with its input path and whether it is zeros only."""
        return self._input_grads


class AotRules:
    """The AOT mode: facts read from the export's descriptors by the tracer.

    A node is backward when the partitioner or the engine tagged it so, or
    (untagged) when it depends on the loss tangent.
    """

    def __init__(self, placeholder_info: dict[fx.Node, dict[str, Any]],
                 tangents: Iterable[fx.Node], gradients: list[tuple[str, Any]],
                 input_gradients: list[tuple[str, Any]] = ()) -> None:
        """Hold the descriptor facts.

        Args:
            placeholder_info: Each placeholder's trace-time facts.
            tangents: The tangent placeholders (the loss's).
            gradients: ``(canonical parameter FQN, output value)`` of each trainable
                parameter's gradient output (tied weights: one per alias).
            input_gradients: ``(input path, output value)`` of each input that requires
                grad.
        """
        self._info = placeholder_info
        self._reach = set(tangents)
        self._grads = [(f, n, False) for f, n in gradients]
        self._input_grads = [(p, n, False) for p, n in input_gradients]

    def placeholder_info(self, node: fx.Node) -> dict[str, Any]:
        """The facts its descriptor gave."""
        return dict(self._info[node])

    def is_backward(self, node: fx.Node) -> bool:
        """Tagged backward by the partitioner or engine, else reached from the tangent."""
        if any(a in self._reach for a in node.all_input_nodes):
            self._reach.add(node)
        tag = node.meta.get("partitioner_tag")
        if tag in ("is_forward", "is_backward"):
            return tag == "is_backward"
        if "autograd_backward" in node.meta:
            return bool(node.meta["autograd_backward"])
        return node in self._reach

    def gradients(self, out: fx.Node) -> list[tuple[str, Any, bool]]:
        """Each trainable parameter's gradient output(s); AOT never emits zero outputs."""
        return self._grads

    def input_gradients(self, out: fx.Node) -> list[tuple[str, Any, bool]]:
        """Each input-gradient output with its input path (never zeros only)."""
        return self._input_grads
