"""Parameter hooks in the traced backward: ``p.register_hook(fn)`` is autograd.

Eager runs a parameter's tensor hooks, in registration order, on the gradient
that reaches the parameter (the sum over every use, tied aliases included)
before it is written to ``p.grad``. Tracing swaps the parameters for fake or
functional stand-ins that carry no hooks, so :class:`ParamHooks` registers the
same functions on the stand-ins while ``train_fn`` is traced: autograd then
runs them inside the traced backward and their ops become graph nodes, which
``joint.run``, the Stepper and a saved graph execute like any other.

In ``mode="aot"`` every alias of a tied parameter is a separate stand-in, so
each hook would see one alias's share of the gradient; while it traces,
:meth:`ParamHooks.applied` points every alias of a hooked parameter at one
stand-in, whose gradient is then eager's sum (``mode="make_fx"`` ties them
already).

A post-accumulate-grad hook runs after ``p.grad`` is written (typically an
optimizer step): no graph output can hold it, so tracing refuses it with
:class:`~jointlab.errors.UnsupportedHookError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from jointlab.errors import UnsupportedHookError
from jointlab.torch_compat import post_accumulate_grad_hooks, reparametrize_module, tensor_hooks

__all__ = ["ParamHooks", "refuse_post_accumulate_hooks"]


def _tensor_at(model: nn.Module, fqn: str) -> torch.Tensor:
    owner, _, leaf = fqn.rpartition(".")
    return getattr(model.get_submodule(owner), leaf)


def refuse_post_accumulate_hooks(model: nn.Module, param_names: list[str]) -> None:
    """Refuse a trainable parameter's ``register_post_accumulate_grad_hook``.

    Args:
        model: The model about to be traced (its real parameters).
        param_names: Trainable parameter FQNs.

    Raises:
        UnsupportedHookError: A parameter has a post-accumulate-grad hook.
    """
    for name in param_names:
        hooks = post_accumulate_grad_hooks(model.get_parameter(name))
        if hooks:
            raise UnsupportedHookError(
                f"parameter {name!r} has {len(hooks)} post-accumulate-grad hook(s) "
                f"(register_post_accumulate_grad_hook, e.g. {_hook_name(hooks[0])}). Such a "
                "hook runs after the gradient is written to p.grad (typically an optimizer "
                "step in backward), and no graph output can hold that. Remove the hook while "
                "tracing (handle.remove()), then call it yourself after the graph ran: "
                "joint.run(model, inputs, accumulate=True) writes p.grad; then call "
                "hook(p) for each such parameter.")


def _hook_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


class ParamHooks:
    """The tensor hooks of a model's trainable parameters, for the traced stand-ins.

    Attributes:
        hooks: Parameter FQN to its hook functions, in registration order
            (only parameters that have hooks).
        aliases: Parameter FQN to its other FQNs (tied weights), for hooked ones.
    """

    def __init__(self, model: nn.Module, param_names: list[str]) -> None:
        """Read the hooks of ``model``'s real parameters (before any swap).

        Args:
            model: The model about to be traced.
            param_names: Trainable parameter FQNs (``named_parameters()`` names).

        Raises:
            UnsupportedHookError: A parameter has a post-accumulate-grad hook.
        """
        refuse_post_accumulate_hooks(model, param_names)
        self.hooks: dict[str, list[Callable[..., Any]]] = {}
        for name in param_names:
            fns = tensor_hooks(model.get_parameter(name))
            if fns:
                self.hooks[name] = fns
        self.aliases: dict[str, list[str]] = {n: [] for n in self.hooks}
        if self.hooks:
            first = {id(p): n for n, p in model.named_parameters()}
            for alias, p in model.named_parameters(remove_duplicate=False):
                canon = first[id(p)]
                if canon in self.aliases and alias != canon:
                    self.aliases[canon].append(alias)
        self._handles: list[Any] = []

    @contextlib.contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        """Register the hooks on the stand-ins ``model`` holds now, for one traced call.

        Tied aliases of a hooked parameter are pointed at one stand-in inside the
        block. The hooks stay registered after it, until :meth:`remove` or the next
        call (the backward runs after ``train_fn`` returns).

        Args:
            model: The model with its parameters swapped for the trace's stand-ins.

        Yields:
            Nothing; run ``train_fn`` inside.
        """
        self.remove()  # AOT calls train_fn twice: never two copies on one stand-in
        if not self.hooks:
            yield
            return
        stand_ins = {n: _tensor_at(model, n) for n in self.hooks}
        ties = {a: stand_ins[c] for c, names in self.aliases.items() for a in names
                if _tensor_at(model, a) is not stand_ins[c]}
        with reparametrize_module(model, ties) if ties else contextlib.nullcontext():
            for name, fns in self.hooks.items():
                t = stand_ins[name]
                if t.requires_grad:  # a pass that traces without autograd needs none
                    self._handles += [t.register_hook(fn) for fn in fns]
            yield

    def remove(self) -> None:
        """Remove the hooks from the stand-ins (they belong to the trace only)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
