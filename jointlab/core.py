"""The interface every stage after tracing reads: :class:`TracedGraph`.

Analyses, io and renderers take a traced graph but never import
:mod:`jointlab.graph` (which hands off to them), so the package stays a
one-way pipeline. They annotate with this protocol instead; a
:class:`jointlab.JointGraph` satisfies it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch
import torch.fx as fx
from torch import nn

if TYPE_CHECKING:
    from jointlab.assumptions import Assumptions
    from jointlab.inputs import InputSpec, StateSpec
    from jointlab.shape_guards import ShapeGuards


class _RunFields(NamedTuple):
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]
    loss_dict: dict[str, Any]


class RunResult(_RunFields):
    """What one run of a joint graph returns: ``loss, grads, loss_dict = joint.run(...)``.

    A three-tuple (``loss``, ``grads`` by parameter FQN, ``loss_dict``) that also
    carries ``input_grads``: the gradient of each tensor input traced with
    ``requires_grad=True``, by dotted input path (eager's ``x.grad``; empty when
    no input requires grad). It is an attribute, not a fourth item, so unpacking
    into three names keeps working.
    """

    def __new__(cls, loss: torch.Tensor, grads: dict[str, torch.Tensor],
                loss_dict: dict[str, Any], input_grads: dict[str, torch.Tensor] | None = None
                ) -> RunResult:
        """Build the result; ``input_grads`` defaults to none."""
        self = super().__new__(cls, loss, grads, loss_dict)
        self.__dict__["input_grads"] = dict(input_grads or {})
        return self

    @property
    def input_grads(self) -> dict[str, torch.Tensor]:
        """Gradient of each input traced with ``requires_grad=True``, by input path."""
        return self.__dict__.get("input_grads", {})

    def __getnewargs__(self) -> tuple[Any, ...]:
        """Copies and pickles keep ``input_grads``."""
        return (*self, self.input_grads)

    def _replace(self, **changes: Any) -> RunResult:
        """A copy with fields replaced (``input_grads`` too), as a NamedTuple's ``_replace``."""
        input_grads = changes.pop("input_grads", self.input_grads)
        return type(self)(*super()._replace(**changes), input_grads)

    def __repr__(self) -> str:
        """The NamedTuple's repr, with ``input_grads`` when there are any."""
        base = super().__repr__()
        return base if not self.input_grads else f"{base[:-1]}, input_grads={self.input_grads!r})"


@dataclass(frozen=True)
class GraphParts:
    """Everything a :class:`jointlab.JointGraph` is built from.

    Both tracing modes and :mod:`jointlab.io.persist` produce this; only
    :mod:`jointlab.graph` turns it into a JointGraph, so neither the tracer
    internals nor io import the graph class.
    """

    graph_module: fx.GraphModule
    mode: str
    state_spec: StateSpec
    input_spec: InputSpec
    param_names: list[str]
    loss_dict_keys: list[str]
    dynamic_dims: dict[str, set[int]] = field(default_factory=dict)
    shape_guards: ShapeGuards | None = None
    runtime: Any = None
    assumptions: Assumptions | None = None
    #: Tensor-argument shapes of each module's first call while traced (empty when loaded).
    module_inputs: dict[str, list[tuple]] = field(default_factory=dict)


class TracedGraph(Protocol):
    """What a reader may use of a traced joint graph (the :class:`GraphParts` and more)."""

    mode: str
    graph_module: fx.GraphModule
    param_names: list[str]
    state_spec: StateSpec
    loss_dict_keys: list[str]
    input_spec: InputSpec
    dynamic_dims: dict[str, set[int]]
    runtime: Any
    shape_guards: ShapeGuards | None
    assumptions: Assumptions
    module_inputs: dict[str, list[tuple]]
    train_fn: Callable[..., Any] | None

    @property
    def graph(self) -> fx.Graph:
        """The underlying ``fx.Graph``."""

    @property
    def placeholders(self) -> list[fx.Node]:
        """All placeholder nodes in order."""

    @property
    def num_state_inputs(self) -> int:
        """How many leading placeholders are parameters or buffers."""

    def flat_args(self, model: nn.Module, inputs: dict[str, Any]) -> list[torch.Tensor]:
        """Validated graph arguments: state then input tensors."""

    def run(self, model: nn.Module, inputs: dict[str, Any], *, accumulate: bool = False
            ) -> RunResult:
        """Execute the joint graph on the live model, like one eager step."""

    def run_with(self, fn: Callable[..., Any], model: nn.Module, inputs: dict[str, Any], *,
                 accumulate: bool = False) -> RunResult:
        """Like ``run``, executing the graph through ``fn``."""

    def cached(self, key: str, build: Any) -> Any:
        """``build(self)`` cached under ``key`` until the graph changes."""
