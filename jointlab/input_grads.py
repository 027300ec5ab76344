"""Inputs that require grad, and inputs that are the model's own tensors.

A tensor input with ``requires_grad=True`` at trace time gets its gradient
computed by the graph and returned in ``RunResult.input_grads``, keyed by its
dotted input path, as eager's ``x.grad`` after ``loss.backward()``. Which
inputs require grad is part of the graph's layout (:class:`LeafSpec`'s
``requires_grad``), so running with another flag is refused.

An input may *be* a tensor the graph already takes: a parameter or buffer of
the model (``inputs={"w": model.weight}``), or, when it requires grad, the
same tensor as an earlier input. Eager sums every use of such a tensor into
one ``.grad``; the tracer feeds those uses the one stand-in (the parameter's,
or the earlier input's), so the autograd engine sums them in eager's order.
The alias is recorded per leaf (``state_alias`` / ``input_alias``) and must
hold again at run time. An input computed from a parameter (a non-leaf whose
autograd history reaches one) is refused: the graph takes it as a plain
tensor, so its gradient could never reach the parameter as eager's does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from jointlab.errors import InputMismatchError, InputTypeError
from jointlab.inputs import InputSpec, LeafSpec

__all__ = ["Aliases", "check_aliases", "graph_input_grads", "input_aliases",
           "input_grads_of", "refuse_parameter_history"]

#: Per tensor-input path: ``("state", fqn)`` or ``("input", earlier path)``.
Aliases = dict[str, tuple[str, str]]


def input_aliases(leaves: Iterable[tuple[str, Any]], state: Mapping[str, torch.Tensor]
                  ) -> Aliases:
    """Which tensor inputs are a state tensor, or an earlier input that requires grad.

    Args:
        leaves: The flattened ``(path, leaf)`` inputs.
        state: The model's parameters and buffers by FQN (each tensor once).

    Returns:
        ``{path: ("state", fqn) | ("input", first path)}`` for the aliased leaves.
    """
    by_id = {id(t): fqn for fqn, t in state.items()}
    first: dict[int, str] = {}
    out: Aliases = {}
    for path, leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            continue
        if id(leaf) in by_id:
            out[path] = ("state", by_id[id(leaf)])
        elif leaf.requires_grad and id(leaf) in first:
            out[path] = ("input", first[id(leaf)])
        else:
            first.setdefault(id(leaf), path)
    return out


def _alias_text(alias: tuple[str, str] | None) -> str:
    if alias is None:
        return "a tensor of its own"
    kind, target = alias
    return f"the model's '{target}'" if kind == "state" else f"the same tensor as input '{target}'"


def traced_aliases(spec: InputSpec) -> Aliases:
    """The aliases recorded at trace time (:func:`input_aliases` of the traced call)."""
    out: Aliases = {}
    for leaf in spec.tensor_leaves:
        if leaf.state_alias:
            out[leaf.path] = ("state", leaf.state_alias)
        elif leaf.input_alias:
            out[leaf.path] = ("input", leaf.input_alias)
    return out


def check_aliases(spec: InputSpec, leaves: list[tuple[str, Any]],
                  state: Mapping[str, torch.Tensor]) -> None:
    """Refuse inputs whose aliasing of the model's state or of each other changed.

    Args:
        spec: The trace-time description (its leaves' ``state_alias`` / ``input_alias``).
        leaves: The given ``(path, leaf)`` pairs.
        state: The live model's parameters and buffers by FQN.

    Raises:
        InputMismatchError: An input that was a parameter (or another input) is not now,
            or the other way round; the message names the input and both sides.
    """
    traced, now = traced_aliases(spec), input_aliases(leaves, state)
    if traced == now:
        return
    path = next(p for p, _ in leaves if traced.get(p) != now.get(p))
    raise InputMismatchError(
        f"input '{path}' was traced as {_alias_text(traced.get(path))} but is now "
        f"{_alias_text(now.get(path))}. Eager sums the gradients of every use of one tensor, "
        "so the graph bakes which inputs are the model's own tensors (or each other): pass "
        "the same tensors as at trace time, or trace again with these.")


def refuse_parameter_history(leaves: Iterable[tuple[str, Any]], model: nn.Module) -> None:
    """Refuse a non-leaf input whose autograd history reaches a trainable parameter.

    Args:
        leaves: The flattened ``(path, leaf)`` inputs.
        model: The model whose parameters count.

    Raises:
        InputTypeError: Naming the input and the parameter it was computed from.
    """
    params = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
    for path, leaf in leaves:
        if not isinstance(leaf, torch.Tensor) or leaf.grad_fn is None:
            continue
        name = _reached_parameter(leaf.grad_fn, params)
        if name is not None:
            raise InputTypeError(
                f"input '{path}' was computed from the parameter '{name}' (it has a grad_fn). "
                "The joint graph takes it as a plain tensor, so its gradient would not reach "
                f"'{name}' as eager's loss.backward() does. Pass the parameter itself "
                f"(inputs={{'{path}': model.<its name>}}) or compute it inside train_fn; "
                "pass it .detach()-ed if no gradient should flow back.")


def _reached_parameter(fn: Any, params: dict[int, str]) -> str | None:
    seen, todo = set(), [fn]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        var = getattr(node, "variable", None)  # AccumulateGrad: the leaf it accumulates into
        if var is not None and id(var) in params:
            return params[id(var)]
        todo.extend(nxt for nxt, _ in getattr(node, "next_functions", ()))
    return None


def graph_input_grads(spec: InputSpec) -> list[str]:
    """Paths of the inputs whose gradient the graph returns, in placeholder order.

    An input aliasing a parameter or an earlier input has no output of its own:
    its gradient is that tensor's (see :func:`input_grads_of`).
    """
    return [leaf.path for leaf in spec.tensor_leaves if _own_grad(leaf)]


def _own_grad(leaf: LeafSpec) -> bool:
    return leaf.requires_grad and not (leaf.state_alias or leaf.input_alias)


def input_grads_of(spec: InputSpec, grads: Mapping[str, torch.Tensor],
                   graph_grads: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every input that requires grad with its gradient, as eager's ``x.grad``.

    Args:
        spec: The graph's input description.
        grads: The parameter gradients by FQN.
        graph_grads: The graph's input-gradient outputs, in :func:`graph_input_grads` order.

    Returns:
        Input path to gradient, in input order; an input that is a parameter gets
        that parameter's gradient, a repeated input its first occurrence's.
    """
    own = dict(zip(graph_input_grads(spec), graph_grads))
    out: dict[str, torch.Tensor] = {}
    for leaf in spec.tensor_leaves:
        if not leaf.requires_grad:
            continue
        if leaf.state_alias:
            if leaf.state_alias in grads:
                out[leaf.path] = grads[leaf.state_alias]
        elif leaf.input_alias:
            out[leaf.path] = out[leaf.input_alias]
        elif leaf.path in own:
            out[leaf.path] = own[leaf.path]
    return out
