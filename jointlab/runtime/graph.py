"""The plain traced-graph object: :class:`RunnableGraph`, its layout, and running it.

A traced graph owns an ``fx.GraphModule`` whose placeholders are the model's
parameters and buffers (in :attr:`RunnableGraph.state_fqns` order) followed by
the tensor leaves of the inputs, and whose outputs are
``[loss, *grads, *loss_dict values]``. Per-node facts live under
``node.meta["jointlab"]`` (see :mod:`jointlab.meta`). This module holds what
every layer may use: the layout, the descriptor-style queries, ``run`` and the
version-keyed cache. The notebook conveniences (``nodes``, ``memory()``,
``compile()``, ``save()``...) are :class:`jointlab.JointGraph`'s, at the top of
the package, so nothing here imports a reader.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.fx as fx
from torch import nn

from jointlab import meta as _meta
from jointlab._deprecation import warn_renamed
from jointlab.assumptions import Assumptions
from jointlab.core import GraphParts, RunResult
from jointlab.errors import NodeExecutionError
from jointlab.input_grads import check_aliases, refuse_parameter_history
from jointlab.inputs import (
    InputSpec,
    StateSpec,
    check_leaves,
    check_state,
    check_structure,
    flatten_inputs,
)
from jointlab.passes.analyze import (
    forget_analysis,
    graph_fingerprint,
    same_version,
)
from jointlab.runtime import descriptors
from jointlab.runtime.plans import MakeFxRuntime, Runtime, run_result
from jointlab.runtime.torch_errors import torch_errors

if TYPE_CHECKING:
    import pandas as pd

    from jointlab.shape_guards import ShapeGuards

_G = TypeVar("_G", bound="RunnableGraph")

_RUN_HINT = ("The joint graph was traced fine but torch rejected a node while running it; "
             "if you edited the graph, check that edit (then joint.recompute()), otherwise "
             "trace again and compare with jl.compare")


class RunnableGraph:
    """One FX graph holding forward, loss and backward of a training step, and how to run it.

    The plain traced-graph object: the graph module, its layout (state and
    input specs, parameter names, loss_dict keys, dynamic dims, guards) and its
    runtime. Readers take it (typed as :class:`jointlab.core.TracedGraph`);
    :class:`jointlab.JointGraph` adds the notebook conveniences on top.
    """

    def __init__(
        self,
        graph_module: fx.GraphModule,
        *,
        mode: str,
        state_spec: StateSpec,
        input_spec: InputSpec,
        param_names: list[str],
        loss_dict_keys: list[str],
        dynamic_dims: dict[str, set[int]] | None = None,
        shape_guards: ShapeGuards | None = None,
        runtime: Runtime | None = None,
        assumptions: Assumptions | None = None,
        module_inputs: dict[str, list[tuple]] | None = None,
    ) -> None:
        """Assemble a traced graph; use :func:`jointlab.trace` rather than this."""
        self.graph_module = graph_module
        self.mode = mode
        self.state_spec = state_spec
        self.input_spec = input_spec
        self.param_names = list(param_names)
        self.loss_dict_keys = list(loss_dict_keys)
        self.dynamic_dims = dict(dynamic_dims or {})
        self.shape_guards = shape_guards
        #: The Python state the graph was traced under (checked before every run).
        self.assumptions = assumptions if assumptions is not None else Assumptions(
            recorded=False)
        self.runtime: Runtime = runtime or MakeFxRuntime()
        #: Tensor-argument shapes of each module's first call while traced (empty if loaded).
        self.module_inputs = dict(module_inputs or {})
        #: The training function that was traced (None for a loaded graph);
        #: :func:`jointlab.compare` re-runs it eagerly as the reference.
        self.train_fn: Callable[..., Any] | None = None
        self._cache: dict[str, tuple[Any, Any]] = {}

    @classmethod
    def from_parts(cls: type[_G], parts: GraphParts) -> _G:
        """Build a traced graph from what a tracing mode or :func:`load` produced.

        Args:
            parts: The graph module and its layout.

        Returns:
            The graph (``train_fn`` unset).
        """
        return cls(parts.graph_module, mode=parts.mode, state_spec=parts.state_spec,
                   input_spec=parts.input_spec, param_names=parts.param_names,
                   loss_dict_keys=parts.loss_dict_keys, dynamic_dims=parts.dynamic_dims,
                   shape_guards=parts.shape_guards, runtime=parts.runtime,
                   assumptions=parts.assumptions, module_inputs=parts.module_inputs)

    # -- layout ---------------------------------------------------------------
    @property
    def graph(self) -> fx.Graph:
        """The underlying ``fx.Graph``."""
        return self.graph_module.graph

    @property
    def state_fqns(self) -> list[str]:
        """Parameters then buffers, in placeholder order (tied weights once)."""
        return list(self.state_spec.fqns)

    @property
    def buffer_names(self) -> list[str]:
        """Buffer FQNs, in placeholder order."""
        return [f for f, p in zip(self.state_spec.fqns, self.state_spec.is_param) if not p]

    @property
    def num_state_inputs(self) -> int:
        """How many leading placeholders are parameters or buffers."""
        return len(self.state_spec.fqns)

    @property
    def placeholders(self) -> list[fx.Node]:
        """All placeholder nodes in order."""
        return [n for n in self.graph.nodes if n.op == "placeholder"]

    @property
    def param_grads(self) -> dict[str, tuple[fx.Node, fx.Node | None]]:
        """Deprecated spelling of :meth:`params_and_grads` (a method, like ``params()``)."""
        warn_renamed("JointGraph.param_grads", "joint.params_and_grads()")
        return self.params_and_grads()

    def grad_terms(self) -> dict[str, tuple[fx.Node, ...]]:
        """Map each trainable parameter FQN to its gradient output nodes, in output order.

        make_fx mode sums a tied weight's uses inside the graph: one node. AOT
        mode returns one output per alias and the runtime adds them, so a tied
        weight has several terms, none of which is its gradient alone. The tuple
        is empty for a parameter the loss does not depend on. Only the graph's
        outputs count, so a node a user pass put in front of a gradient output is
        found, not the node it replaced.
        """
        terms: dict[str, list[fx.Node]] = {name: [] for name in self.param_names}
        for n in self.graph.output_node().args[0]:
            if not isinstance(n, fx.Node):
                continue
            info = _meta.info(n)
            if info.get("grad_of") in terms and not info.get("zero_grad"):
                terms[info["grad_of"]].append(n)
        return {name: tuple(t) for name, t in terms.items()}

    def params_and_grads(self) -> dict[str, tuple[fx.Node, fx.Node | tuple[fx.Node, ...] | None]]:
        """Map each trainable parameter FQN to (its placeholder, its gradient node or None).

        The gradient node is None for a parameter the loss does not depend on.
        Where no single node holds the gradient (a tied weight in AOT mode: one
        term per alias, added by the runtime), the entry is the tuple of terms,
        never one term passed off as the whole; see :meth:`grad_terms`.
        """
        ph = {_meta.info(n).get("fqn"): n for n in self.placeholders}
        out: dict[str, tuple[fx.Node, fx.Node | tuple[fx.Node, ...] | None]] = {}
        for name, terms in self.grad_terms().items():
            out[name] = (ph[name], terms[0] if len(terms) == 1 else (terms or None))
        return out

    # -- descriptor-style queries (one API over both modes; see _descriptors) ---
    def inputs_and_grads(self) -> list[tuple[fx.Node, fx.Node | None]]:
        """Every input placeholder with its gradient node (None if it has none)."""
        return descriptors.inputs_and_grads(self)

    def outputs_and_tangents(self) -> list[tuple[fx.Node, fx.Node | None]]:
        """Every output value with its tangent placeholder (None if it has none)."""
        return descriptors.outputs_and_tangents(self)

    def params(self) -> dict[str, fx.Node]:
        """Parameter placeholders by FQN."""
        return descriptors.params(self)

    def buffers(self) -> dict[str, fx.Node]:
        """Buffer placeholders by FQN."""
        return descriptors.buffers(self)

    @property
    def guards(self) -> pd.DataFrame:
        """Every assumption the graph was traced under, one row each, checked on every run.

        Module ``training`` flags and classes, hooks, parameters' ``requires_grad``, every
        attribute and variable the trace read (dropout ``p``, ``config.hidden_dropout``, a
        global; see :mod:`jointlab.trace.watch_table`), the process-wide settings the graph
        bakes and, for a dynamic trace, the shape guards. Columns: ``kind, target, attr,
        traced, checks, source``.
        """
        import pandas as pd

        table = self.assumptions.table()
        if self.shape_guards is None:
            return table
        return pd.concat([table, pd.DataFrame(self.shape_guards.rows(), columns=table.columns)],
                         ignore_index=True)

    # -- running --------------------------------------------------------------
    def flat_args(self, model: nn.Module, inputs: dict[str, Any]) -> list[torch.Tensor]:
        """Validate ``model`` and ``inputs`` and return state + tensor inputs, flat.

        Args:
            model: The live model (same parameter names, shapes, dtypes and devices).
            inputs: Keyword inputs with the traced structure.

        Returns:
            Parameters and buffers in ``state_fqns`` order, then tensor inputs.

        Raises:
            jointlab.errors.JointlabError: Anything differs from trace time.
        """
        leaves, treespec = flatten_inputs(inputs)
        check_structure(self.input_spec, treespec)
        check_leaves(self.input_spec, leaves, self.dynamic_dims)
        tensors = {p: v for p, v in leaves if isinstance(v, torch.Tensor)}
        if self.shape_guards is not None:
            self.shape_guards.validate(tensors)
        state = check_state(self.state_spec, model)
        check_aliases(self.input_spec, leaves, dict(zip(self.state_spec.fqns, state)))
        refuse_parameter_history(leaves, model)
        check_feed = getattr(self.runtime, "check_feed", None)  # DTensor state: plan first
        if check_feed is not None:
            check_feed([*state, *tensors.values()])
        self.assumptions.check(model)
        return [*state, *tensors.values()]

    def run(self, model: nn.Module, inputs: dict[str, Any], *, accumulate: bool = False
            ) -> RunResult:
        """Execute the joint graph on the live model, like one eager step.

        Buffer updates (e.g. BatchNorm running statistics) land in ``model``
        exactly as one eager forward would leave them.

        Args:
            model: The model that was traced (or one with the same state layout).
            inputs: Keyword inputs with the traced structure.
            accumulate: Also add the gradients into ``param.grad``, like ``loss.backward()``.

        Returns:
            A :class:`jointlab.core.RunResult` ``(loss, grads, loss_dict)``:
            ``grads`` maps FQN to gradient in :attr:`param_names` order;
            ``result.input_grads`` maps the path of each input traced with
            ``requires_grad=True`` to its gradient (eager's ``x.grad``).
        """
        return self.run_with(self.graph_module, model, inputs, accumulate=accumulate)

    def run_with(self, fn: Callable[..., Any], model: nn.Module, inputs: dict[str, Any], *,
                 accumulate: bool = False) -> RunResult:
        """Like :meth:`run`, but execute the graph through ``fn`` (e.g. a compiled module).

        Args:
            fn: Called with the graph's positional args; returns its outputs.
            model: The live model.
            inputs: Keyword inputs with the traced structure.
            accumulate: Also add the gradients into ``param.grad``.

        Returns:
            A :class:`jointlab.core.RunResult` ``(loss, grads by FQN, loss_dict)``.
        """
        flat = self.flat_args(model, inputs)
        with torch.no_grad(), torch_errors("joint.run", NodeExecutionError, _RUN_HINT):
            outputs = fn(*self.runtime.prepare(self, flat))
            result = run_result(self, *self.runtime.finish(self, list(outputs), flat))
        grad_map = result.grads
        if accumulate:
            params = dict(model.named_parameters())
            with torch.no_grad():
                for name, g in grad_map.items():
                    p = params[name]
                    p.grad = g.detach().clone() if p.grad is None else p.grad.add_(g)
        return result

    # -- caching and recomputing derived views --------------------------------
    def graph_version(self) -> tuple[Any, ...]:
        """An O(1) stamp of the graph's version (recompiling or adding a node changes it)."""
        return graph_fingerprint(self.graph_module)

    def cached(self, key: str, build: Any) -> Any:
        """Return ``build(self)`` cached under ``key`` until the graph changes."""
        version = self.graph_version()
        hit = self._cache.get(key)
        if hit is not None and same_version(hit[0], version):
            return hit[1]
        value = build(self)
        self._cache[key] = (version, value)
        return value

    def recompute(self) -> None:
        """Take an edited graph (or node meta) in: recompile, drop caches, forget the analysis.

        The graph object runs no pass: after this, readers refuse the plain graph
        with :class:`jointlab.errors.StaleAnalysisError` until the analysis is
        redone (:func:`jointlab.passes.pipeline.reanalyze`), which
        ``JointGraph.recompute`` does.
        """
        self.graph_module.recompile()
        self._cache.clear()
        forget_analysis(self.graph_module)

    def invalidate(self) -> None:
        """Deprecated alias of :meth:`recompute` (kept for one release; warns)."""
        warn_renamed("joint.invalidate()", "joint.recompute()")
        self.recompute()

    def __repr__(self) -> str:
        """Summarize the graph in one line."""
        counts: dict[str, int] = {}
        for n in self.graph.nodes:
            ph = _meta.phase(n)
            counts[ph] = counts.get(ph, 0) + 1
        order = [p for p in _meta.PHASES if p in counts] + sorted(set(counts) - set(_meta.PHASES))
        body = ", ".join(f"{k}={counts[k]}" for k in order)
        return f"{type(self).__name__}(mode={self.mode!r}, nodes={len(self.graph.nodes)}: {body})"
