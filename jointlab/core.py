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


class RunResult(NamedTuple):
    """What one run of a joint graph returns: ``loss, grads, loss_dict = joint.run(...)``."""

    loss: torch.Tensor
    grads: dict[str, torch.Tensor]
    loss_dict: dict[str, Any]


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
