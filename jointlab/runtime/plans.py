"""How each tracing mode maps jointlab's flat call layout onto its graph and back.

A :class:`Runtime` turns the validated flat arguments (parameters and
buffers in state order, then the tensor inputs) into the graph's positional
arguments, and the graph's outputs back into ``(loss, grads, loss_dict)``, where
``grads`` lists the parameters' gradients (``param_names`` order) followed by the
gradients of the inputs traced with ``requires_grad=True``
(:func:`jointlab.input_grads.graph_input_grads` order); :func:`run_result`
turns that into the :class:`~jointlab.core.RunResult` every runner returns.

- :class:`MakeFxRuntime`: the default mode's graph takes and returns that
  layout unchanged.
- :class:`AotRuntime`: the AOT export's graph has descriptor-driven
  placeholders and outputs; its plan is plain data, built by
  :mod:`jointlab.trace.aot` and stored by :mod:`jointlab.io.persist`, so
  loading an AOT archive never imports the exporter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from jointlab.core import RunResult, TracedGraph
from jointlab.input_grads import graph_input_grads, input_grads_of

__all__ = ["AotRuntime", "MakeFxRuntime", "Runtime", "run_result"]


def run_result(joint: TracedGraph, loss: Any, grads: list[Any], ld: list[Any]) -> RunResult:
    """The :class:`RunResult` of a runtime's ``finish``: gradients and inputs by name.

    Args:
        joint: The graph that ran.
        loss: The loss.
        grads: Parameter gradients in ``param_names`` order, then input gradients.
        ld: The loss_dict values in ``loss_dict_keys`` order.

    Returns:
        ``(loss, grads by FQN, loss_dict)`` with ``input_grads`` by input path.
    """
    n = len(joint.param_names)
    by_fqn = dict(zip(joint.param_names, grads[:n]))
    inputs = input_grads_of(joint.input_spec, by_fqn, list(grads[n:]))
    return RunResult(loss, by_fqn, dict(zip(joint.loss_dict_keys, ld)), inputs)


class Runtime(Protocol):
    """How one tracing mode turns validated inputs into graph args and back."""

    def prepare(self, joint: TracedGraph, flat: list[torch.Tensor]) -> list[Any]:
        """Return the graph's positional args from state tensors + tensor inputs."""

    def finish(
        self, joint: TracedGraph, outputs: list[Any], flat: list[torch.Tensor]
    ) -> tuple[Any, list[torch.Tensor], list[Any]]:
        """Return ``(loss, parameter then input gradients, loss_dict values)``."""


class MakeFxRuntime:
    """Runtime of the default mode: the graph takes and returns the plain layout."""

    def prepare(self, joint: TracedGraph, flat: list[torch.Tensor]) -> list[Any]:
        """Pass the inputs through unchanged."""
        return flat

    def finish(self, joint: TracedGraph, outputs: list[Any], flat: list[torch.Tensor]
               ) -> tuple[Any, list[torch.Tensor], list[Any]]:
        """Split ``[loss, *grads, *input grads, *loss_dict]``."""
        n = len(joint.param_names) + len(graph_input_grads(joint.input_spec))
        return outputs[0], list(outputs[1 : 1 + n]), list(outputs[1 + n :])


@dataclass
class AotRuntime:
    """Maps jointlab's flat layout onto the AOT graph and back.

    Attributes:
        arg_plan: Per placeholder, an index into the flat args, or None for the
            loss tangent (fed ones of ``tangent_shape``).
        out_plan: Per output, ``(kind, index)``: ``("loss", 0)``, ``("ld", j)``
            for the j-th tensor loss_dict value, ``("grad", k)`` for
            ``param_names[k]``, ``("igrad", k)`` for the k-th input that requires
            grad, ``("mut", i)`` to copy into flat arg ``i``, or ``("skip", 0)``.
        param_flat: Flat index of each trainable parameter (for zero grads).
        loss_dict_keys: Every loss_dict key, in ``train_fn``'s order.
        ld_consts: Non-tensor loss_dict values by key.
        tangent_shape: Shape of the loss tangent.
        tangent_dtype: Dtype of the loss tangent.
    """

    arg_plan: list[int | None]
    out_plan: list[tuple[str, int]]
    param_flat: list[int]
    loss_dict_keys: list[str]
    ld_consts: dict[str, Any] = field(default_factory=dict)
    tangent_shape: tuple[int, ...] = ()
    tangent_dtype: torch.dtype = torch.float32

    def prepare(self, joint: TracedGraph, flat: list[torch.Tensor]) -> list[Any]:
        """Return the graph's args: aliases repeated, ones for the loss tangent."""
        device = flat[0].device if flat else None
        return [
            torch.ones(self.tangent_shape, dtype=self.tangent_dtype, device=device)
            if i is None else flat[i]
            for i in self.arg_plan
        ]

    def finish(self, joint: TracedGraph, outputs: list[Any], flat: list[torch.Tensor]
               ) -> tuple[Any, list[torch.Tensor], list[Any]]:
        """Apply input mutations, merge alias gradients, return the plain layout."""
        loss: Any = None
        n_in = len(graph_input_grads(joint.input_spec))
        grads: list[torch.Tensor | None] = [None] * (len(self.param_flat) + n_in)
        ld: dict[int, Any] = {}
        for out, (kind, i) in zip(outputs, self.out_plan):
            if kind == "loss":
                loss = out
            elif kind == "ld":
                ld[i] = out
            elif kind == "grad" and out is not None:
                grads[i] = out if grads[i] is None else grads[i] + out
            elif kind == "igrad" and out is not None:
                grads[len(self.param_flat) + i] = out
            elif kind == "mut":
                flat[i].copy_(out)
        full = [torch.zeros_like(flat[self._flat_of(joint, k)]) if g is None else g
                for k, g in enumerate(grads)]
        tensor_vals = iter(ld[j] for j in sorted(ld))
        values = [self.ld_consts[k] if k in self.ld_consts else next(tensor_vals)
                  for k in self.loss_dict_keys]
        return loss, full, values

    def _flat_of(self, joint: TracedGraph, k: int) -> int:
        """The flat argument whose gradient is ``k`` (a parameter, then inputs)."""
        if k < len(self.param_flat):
            return self.param_flat[k]
        paths = [leaf.path for leaf in joint.input_spec.tensor_leaves]
        return len(joint.state_spec.fqns) + paths.index(
            graph_input_grads(joint.input_spec)[k - len(self.param_flat)])
