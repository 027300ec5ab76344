"""The magnitudes behind the outputs of convolution and normalization backward ops.

A parameter whose contribution a train-mode norm cancels gets a gradient that
is zero in exact arithmetic: a conv bias feeding a train-mode BatchNorm (the
norm subtracts the batch mean, so a per-channel constant never reaches the
loss), or a LayerNorm bias feeding a 1x1 conv and then a BatchNorm. Its
gradient is still computed, as a sum over the batch of the norm's backward
output, whose terms cancel to rounding noise (1e-9 and below) that two correct
implementations draw differently. Its rounding is relative to the terms, not
to the sum, so :func:`backward_scale` evaluates each gradient output of
``convolution_backward``, ``native_batch_norm_backward``,
``native_layer_norm_backward`` and ``native_group_norm_backward`` on the
magnitudes it combined: ``convolution_backward(|dy|, |x|, |w|)`` (it is linear
in each), ``sum(|dy|)`` for a bias, ``sum(|dy · x̂|)`` for a norm's weight, and
for a norm's input gradient, a difference of ``dy`` and its means, the sum of
their magnitudes. The scale of ``dy`` itself is the one that produced it, so a
chain of such ops (a BatchNorm's gradient through a conv into a LayerNorm) is
followed back.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from jointlab.meta import op_name

__all__ = ["backward_reads", "backward_scale", "backward_source"]

_OPS = frozenset({"convolution_backward", "native_batch_norm_backward",
                  "native_layer_norm_backward", "native_group_norm_backward"})

Scale = Callable[[fx.Node], "torch.Tensor | None"]


def backward_source(node: fx.Node) -> fx.Node | None:
    """The convolution or norm backward op whose output ``node`` is (a getitem), else None."""
    if node.op != "call_function" or node.target is not operator.getitem:
        return None
    src = node.args[0]
    return src if isinstance(src, fx.Node) and op_name(src) in _OPS \
        and isinstance(node.args[1], int) else None


def backward_reads(node: fx.Node, src: fx.Node) -> set[str]:
    """Names of the nodes :func:`backward_scale` reads besides the scale of ``dy``."""
    return {node.name, *(a.name for a in src.all_input_nodes)}


def backward_scale(node: fx.Node, src: fx.Node, value_of: Callable[[fx.Node], Any],
                   dy_scale: Scale) -> torch.Tensor | None:
    """The magnitudes that produced output ``node`` of backward op ``src``, elementwise.

    Args:
        node: A ``getitem`` of ``src``.
        src: A node of :data:`_OPS`, its first argument the gradient ``dy``.
        value_of: The value of a node of the same graph (None when unknown).
        dy_scale: The magnitudes that produced a node's value (``dy``'s).

    Returns:
        A non-negative tensor shaped like ``node``'s value, or None when a value
        it needs is unknown or the op has no magnitude form for that output.
    """
    value = value_of(node)
    args = [value_of(a) if isinstance(a, fx.Node) else a for a in src.args]
    dy = dy_scale(src.args[0]) if isinstance(src.args[0], fx.Node) else None
    if dy is None and isinstance(args[0], torch.Tensor):
        dy = args[0].detach().abs()
    if not isinstance(value, torch.Tensor) or not isinstance(dy, torch.Tensor) \
            or not isinstance(args[1], torch.Tensor):  # x, the op's forward input
        return None
    args[0] = dy.double()
    index, name = node.args[1], op_name(src)
    try:
        with torch.no_grad():
            if name == "convolution_backward":
                out = _conv(args, index)
            elif name == "native_batch_norm_backward":
                out = _batch_norm(args, index)
            elif name == "native_layer_norm_backward":
                out = _layer_norm(args, index)
            else:
                out = _sum_but_channels(args[0]) if index == 2 else None
    except (RuntimeError, TypeError, ValueError, IndexError):
        return None
    if not isinstance(out, torch.Tensor) or out.numel() != value.numel():
        return None
    return out.to(value.dtype if value.is_floating_point() else torch.float64).reshape(
        value.shape)


def _mag(t: Any) -> Any:
    return t.detach().double().abs() if isinstance(t, torch.Tensor) else t


def _conv(args: list[Any], index: int) -> torch.Tensor | None:
    """``convolution_backward`` on magnitudes: it is linear in ``dy``, ``x`` and ``w``."""
    mask = [i == index for i in range(3)]
    dy, x, w = (_mag(a) for a in args[:3])
    out = torch.ops.aten.convolution_backward.default(dy, x, w, *args[3:-1], mask)
    return out[index]


def _sum_but_channels(t: torch.Tensor) -> torch.Tensor:
    return t.sum(dim=[d for d in range(t.dim()) if d != 1])


def _batch_norm(args: list[Any], index: int) -> torch.Tensor | None:
    """``native_batch_norm_backward``'s outputs on magnitudes (``dy`` already one)."""
    dy, x, w, running_mean, running_var, save_mean, save_invstd, train, eps = args[:9]
    shape = [1, -1] + [1] * (x.dim() - 2)
    mean, invstd = (save_mean, save_invstd) if train else \
        (running_mean, (_mag(running_var) + eps).rsqrt())
    if not isinstance(mean, torch.Tensor) or not isinstance(invstd, torch.Tensor):
        return None
    xhat = (x.detach().double() - mean.double().reshape(shape)) * invstd.double().reshape(shape)
    if index == 2:
        return _sum_but_channels(dy)
    if index == 1:
        return _sum_but_channels(dy * xhat.abs())
    scale = invstd.double().abs().reshape(shape)
    if isinstance(w, torch.Tensor):
        scale = scale * _mag(w).reshape(shape)
    if not train:
        return scale * dy
    dims = [d for d in range(x.dim()) if d != 1]
    return scale * (dy + dy.mean(dims, keepdim=True)
                    + xhat.abs() * (dy * xhat.abs()).mean(dims, keepdim=True))


def _layer_norm(args: list[Any], index: int) -> torch.Tensor | None:
    """``native_layer_norm_backward``'s outputs on magnitudes (``dy`` already one)."""
    dy, x, shape, mean, rstd, w = args[:6]
    if not isinstance(mean, torch.Tensor) or not isinstance(rstd, torch.Tensor):
        return None
    axis = x.dim() - len(shape)
    xhat = ((x.detach().double() - mean.double()) * rstd.double()).abs()
    lead = list(range(axis))
    if index == 2:
        return dy.sum(lead) if lead else dy
    if index == 1:
        return (dy * xhat).sum(lead) if lead else dy * xhat
    wdy = dy * _mag(w) if isinstance(w, torch.Tensor) else dy
    dims = list(range(axis, x.dim()))
    return rstd.double().abs() * (wdy + wdy.mean(dims, keepdim=True)
                                  + xhat * (wdy * xhat).mean(dims, keepdim=True))
