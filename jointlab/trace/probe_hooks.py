"""Trace-time probes: which graph node *is* each module call's output and its gradient.

While a training step is traced, forward hooks on every module look up the
graph node that produced each tensor the module returns, and a tensor hook on
each such output looks up the node that produced the gradient reaching it.
These are identities recorded by the tracer itself, not guesses from shapes
or graph structure, so ``compare`` can pair a graph value with the eager value
recorded at the same point (same module, same call, same output leaf).

The pass :func:`jointlab.passes.probes.write_probes` then writes, on the
graph nodes the hooks found (see :mod:`jointlab.meta`):

- ``probe_out``: list of ``[fqn, call, leaf]``: this node is output ``leaf``
  of call number ``call`` (0-based, per module, in execution order) of module ``fqn``;
- ``probe_grad``: list of ``[fqn, call, leaf]``: this node is the gradient of
  the loss with respect to that output;
- ``probe_settled``: list of ``[fqn, call, leaf]``, on the last in-place write to
  that output's storage before the module returned (make_fx: ``out = zeros_like(x);
  out[:, t] = ...``): the output node holds the returned value once this node ran.

For that last key the hooks also record, per output, the graph's last node when
the module returned (:attr:`ProbeRecorder.returned`).

Hooks are removed on exit, whatever happens; the model is never changed.
The lookups use private torch APIs (``get_innermost_proxy_mode``,
``get_proxy_slot``, functional-tensor unwrapping). When they are missing,
:data:`AVAILABLE` is False, nothing is recorded, and ``compare`` reports that
it cannot localise a divergence instead of guessing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from jointlab.errors import UnsupportedTorchError
from jointlab.inputs import tensor_leaves

try:  # private torch APIs, present in torch 2.13 and 2.14
    from jointlab.torch_compat import (
        FunctionalTensor,
        from_functional_tensor,
        get_innermost_proxy_mode,
        get_proxy_slot,
        sync_functional,
    )

    AVAILABLE = True
except UnsupportedTorchError:  # pragma: no cover - a torch without these internals
    AVAILABLE = False

Key = tuple[str, int, int]  # (module fqn, call index, output leaf)


def traced_node(t: Any) -> fx.Node | None:
    """The graph node that produced ``t`` in the trace now running, or None.

    Args:
        t: A tensor of the trace now running (fake, or AOT's functional wrapper).

    Returns:
        Its node, or None outside a trace, for a non-tensor, or without the private APIs.
    """
    if not AVAILABLE or not isinstance(t, torch.Tensor):
        return None
    mode = get_innermost_proxy_mode()
    if mode is None:
        return None
    inner = t
    if isinstance(inner, FunctionalTensor):  # AOT mode: the fake value under the wrapper
        sync_functional(inner)
        inner = from_functional_tensor(inner.elem)
    if not isinstance(inner, torch.Tensor):  # a gradient no kernel produced (meta AOT)
        return None
    slot = get_proxy_slot(inner, mode.tracer, None)
    return None if slot is None else slot.proxy.node


@dataclass
class ProbeRecorder:
    """What the hooks saw during one trace: node identities per (module, call, leaf)."""

    outputs: dict[Key, fx.Node] = field(default_factory=dict)
    grads: dict[Key, fx.Node] = field(default_factory=dict)
    #: The graph's last node when the module returned each output (in-place writes
    #: to the output's storage up to it are part of the returned value).
    returned: dict[Key, fx.Node] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    #: Tensor-argument shapes of each module's first call (symbolic sizes as text).
    in_shapes: dict[str, list[tuple]] = field(default_factory=dict)

    def reset(self) -> None:
        """Forget everything (a new tracing pass starts)."""
        self.outputs.clear()
        self.grads.clear()
        self.returned.clear()
        self.calls.clear()
        self.in_shapes.clear()


def _grad_hook(rec: ProbeRecorder, key: Key):
    def hook(grad: torch.Tensor) -> None:
        node = traced_node(grad)
        if node is not None:
            rec.grads[key] = node
    return hook


def shape_of(t: torch.Tensor) -> tuple:
    """``t``'s sizes: ints, a symbolic size as its text (never an ``int()`` that would guard)."""
    return tuple(d if isinstance(d, int) else str(d) for d in t.shape)


def _last_node(mode: Any) -> fx.Node | None:
    """The node the trace now running appended last (O(1)), or None."""
    graph = getattr(getattr(mode, "tracer", None), "graph", None)
    return next(iter(reversed(graph.nodes)), None) if graph is not None else None


def _output_hook(rec: ProbeRecorder, fqn: str):
    def hook(_mod: nn.Module, args: Any, kwargs: Any, out: Any) -> None:
        mode = get_innermost_proxy_mode()
        if mode is None:  # AOT's metadata pass: not the graph
            return
        call = rec.calls.get(fqn, 0)
        rec.calls[fqn] = call + 1
        if call == 0:
            rec.in_shapes[fqn] = [shape_of(t) for t in tensor_leaves((args, kwargs))]
        for leaf, t in enumerate(tensor_leaves(out)):
            node = traced_node(t)
            if node is None:
                continue
            rec.outputs[(fqn, call, leaf)] = node
            if (last := _last_node(mode)) is not None:
                rec.returned[(fqn, call, leaf)] = last
            if t.requires_grad:
                t.register_hook(_grad_hook(rec, (fqn, call, leaf)))
    return hook


def _root_pre_hook(rec: ProbeRecorder):
    def hook(_mod: nn.Module, _args: Any) -> None:
        if get_innermost_proxy_mode() is not None:
            rec.reset()  # each traced pass over the model starts from scratch
    return hook


@contextlib.contextmanager
def module_probes(model: nn.Module) -> Iterator[ProbeRecorder]:
    """Record, while tracing ``model``, every module output's node, its gradient and inputs.

    Args:
        model: The model being traced (hooks are added and always removed).

    Yields:
        The :class:`ProbeRecorder`; call :meth:`ProbeRecorder.write` on the traced graph.
    """
    rec = ProbeRecorder()
    if not AVAILABLE:
        yield rec
        return
    handles = [model.register_forward_pre_hook(_root_pre_hook(rec))]
    handles += [m.register_forward_hook(_output_hook(rec, fqn), with_kwargs=True)
                for fqn, m in model.named_modules()]
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()
