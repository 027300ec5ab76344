"""What both tracing modes share: the request, the loss checks, the loss box.

:class:`TraceRequest` is what :func:`jointlab.trace` derives from the user's
call before either mode traces (flattened inputs, state and input specs,
dynamic dims, trainable parameters). :class:`LossBox` is how ``train_fn``'s
loss_dict keys and unused parameters come back out of a trace in both modes.
Nothing here imports a mode or :mod:`jointlab.graph`; a mode returns
:class:`jointlab.core.GraphParts` built by :meth:`TraceRequest.parts`.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from jointlab import torch_compat
from jointlab.core import GraphParts
from jointlab.errors import DataDependentError, NoTrainableParametersError
from jointlab.input_grads import graph_input_grads, input_aliases, refuse_parameter_history
from jointlab.inputs import (
    InputSpec,
    StateSpec,
    describe_inputs,
    describe_state,
    flatten_inputs,
    model_state,
)
from jointlab.runtime.torch_errors import caller_line
from jointlab.shape_guards import ShapeGuards, resolve_dynamic_dims
from jointlab.sources import user_line


def _data_dependent() -> tuple[type, ...]:
    """torch's data-dependent tracing errors, resolved on first use (they load sympy)."""
    return (torch_compat.DataDependentOutputException,
            torch_compat.DynamicOutputShapeException,
            torch_compat.GuardOnDataDependentSymNode)


@dataclass
class LossBox:
    """Filled while ``train_fn`` runs under a trace: what its result looked like.

    Attributes:
        keys: Every loss_dict key, in ``train_fn``'s order.
        consts: Non-tensor loss_dict values (AOT returns them from the runtime).
        zero_grads: Trainable parameters the loss does not depend on (make_fx).
        zero_input_grads: Inputs requiring grad that the loss does not depend on (make_fx).
    """

    keys: list[str] = field(default_factory=list)
    consts: dict[str, Any] = field(default_factory=dict)
    zero_grads: list[str] = field(default_factory=list)
    zero_input_grads: list[str] = field(default_factory=list)

    def record(self, loss_dict: dict[str, Any]) -> None:
        """Remember the keys and non-tensor values of one call's loss_dict."""
        self.keys = list(loss_dict)
        self.consts = {k: v for k, v in loss_dict.items() if not isinstance(v, torch.Tensor)}


def trainable_names(model: nn.Module) -> list[str]:
    """Names of parameters with ``requires_grad``, tied weights once.

    Raises:
        NoTrainableParametersError: There are none.
    """
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if not names:
        raise NoTrainableParametersError(
            f"{type(model).__name__} has no parameter with requires_grad=True, so there is "
            "no gradient to trace. Unfreeze at least one parameter."
        )
    return names


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn data-dependent tracing failures into :class:`DataDependentError`."""
    try:
        yield
    except Exception as exc:
        if not isinstance(exc, _data_dependent()):
            raise
        line = user_line(traceback.extract_tb(exc.__traceback__))
        if line:
            where = f" at {line}"
        else:  # raised by a gradient formula: no Python frame of the model is on the stack
            where = (f" (in the backward, traced for the jl.trace call{caller_line()}: an "
                     "op's gradient has data-dependent sizes, as boolean-mask indexing "
                     "such as x[mask] = value has)")
        raise DataDependentError(
            "the model reads a tensor's value in Python while tracing" + where + ". A joint "
            "graph cannot depend on data: replace Python control flow on tensor values "
            "(if, .item(), printing a tensor) and boolean-mask indexing with tensor ops such "
            "as torch.where (or turn the data-dependent feature off while tracing)."
        ) from exc


def state_placeholder_info(model: nn.Module, fqn: str, is_param: bool) -> dict[str, Any]:
    """Trace-time annotation of a parameter or buffer placeholder."""
    owner = fqn.rpartition(".")[0]
    return {"phase": "param" if is_param else "buffer", "fqn": fqn, "module": owner,
            "module_type": type(model.get_submodule(owner)).__name__}


@dataclass(frozen=True)
class TraceRequest:
    """What both tracing modes derive from the user's call before tracing."""

    leaves: list[tuple[str, Any]]
    treespec: Any
    input_spec: InputSpec
    tensors: list[tuple[str, torch.Tensor]]
    dyn_dims: dict[str, set[int]]
    state_spec: StateSpec
    param_names: list[str]

    @classmethod
    def of(cls, model: nn.Module, inputs: dict[str, Any], dynamic: bool,
           dynamic_arg_dims: dict[str, int | list[int]] | None) -> TraceRequest:
        """Flatten and check the inputs and the model state (raises jointlab errors)."""
        leaves, treespec = flatten_inputs(inputs)
        refuse_parameter_history(leaves, model)
        tensors = [(p, v) for p, v in leaves if isinstance(v, torch.Tensor)]
        aliases = input_aliases(leaves, model_state(model))
        return cls(leaves, treespec, describe_inputs(leaves, treespec, aliases), tensors,
                   resolve_dynamic_dims(tensors, dynamic, dynamic_arg_dims),
                   describe_state(model), trainable_names(model))

    @property
    def grad_paths(self) -> list[str]:
        """Inputs whose gradient the graph returns (requires grad, no alias), in order."""
        return graph_input_grads(self.input_spec)

    def substitute(self, values: list[Any], state: dict[str, Any]) -> list[Any]:
        """The leaf values ``train_fn`` gets: each aliasing input replaced by its stand-in.

        Args:
            values: The traced leaf values, in :attr:`leaves` order.
            state: The traced state stand-ins by FQN (aliased parameters and buffers).

        Returns:
            ``values`` with a parameter input as the parameter's stand-in and a repeated
            input as its first occurrence, so autograd sums their uses as eager does.
        """
        spec = {leaf.path: leaf for leaf in self.input_spec.leaves}
        index = {p: i for i, (p, _) in enumerate(self.leaves)}
        out = list(values)
        for i, (path, _) in enumerate(self.leaves):
            leaf = spec[path]
            if leaf.state_alias:
                out[i] = state[leaf.state_alias]
            elif leaf.input_alias:
                out[i] = out[index[leaf.input_alias]]
        return out

    def parts(self, gm: fx.GraphModule, mode: str, box: LossBox,
              guards: ShapeGuards | None, runtime: Any = None,
              module_inputs: dict[str, list[tuple]] | None = None) -> GraphParts:
        """The traced graph with this request's layout, ready for :class:`jointlab.JointGraph`."""
        return GraphParts(gm, mode=mode, state_spec=self.state_spec,
                          input_spec=self.input_spec, param_names=list(self.param_names),
                          loss_dict_keys=list(box.keys), dynamic_dims=dict(self.dyn_dims),
                          shape_guards=guards, runtime=runtime,
                          module_inputs=dict(module_inputs or {}))

    def guards(self, shape_env: Any, fake_user: list[tuple[str, torch.Tensor]]
               ) -> ShapeGuards | None:
        """The shape guards of a dynamic trace (None for a static one)."""
        if not self.dyn_dims or shape_env is None:
            return None
        sizes = {p: tuple(t.shape) for p, t in self.tensors}
        return ShapeGuards.record(shape_env, fake_user, sizes, self.dyn_dims)
