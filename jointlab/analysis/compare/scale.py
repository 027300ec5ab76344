"""The scale a value was produced at: the magnitudes that summed into it.

Rounding error is proportional to the magnitudes an op combines, not to the
size of its result. A sum of terms that cancel (the gradient of an attention
key bias, zero in exact arithmetic because softmax ignores a constant added to
every key) comes out as rounding noise around 1e-11, and two correct
implementations return different noise; judged against its own size, noise
fails noise. :func:`produced_scale` evaluates the producing op on the absolute
values of what it combined (``sum(|x|)`` for ``sum(x)``, ``|a| @ |b|`` for
``a @ b``, ``|a| + |b|`` for ``a - b``), through views and additions, and
through the backward ops of convolutions and norms
(:mod:`jointlab.analysis.compare.backward_scale`: a conv bias whose
contribution a train-mode BatchNorm cancels is judged by the norm's backward
output it sums), so a tolerance can be set relative to it
(:func:`jointlab.analysis.compare.judge.close`).
Ops it does not know are scaled by their own value's magnitude, as before.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from jointlab.analysis.compare.backward_scale import (
    backward_reads,
    backward_scale,
    backward_source,
)
from jointlab.meta import op_name
from jointlab.torch_compat import op_parts

__all__ = ["produced_scale", "scale_reads"]

# Same values, another shape or layout: the scale goes through them unchanged.
_VIEWS = frozenset({"view", "_unsafe_view", "reshape", "permute", "t", "transpose", "expand",
                    "squeeze", "unsqueeze", "clone", "alias", "detach", "contiguous",
                    "select", "slice", "_to_copy", "squeeze_copy", "unsqueeze_copy",
                    "view_copy", "permute_copy", "t_copy", "transpose_copy", "expand_copy"})
# Sums of products, linear in each input: the op itself on the inputs' scales.
_REDUCTIONS = frozenset({"sum", "mean", "mm", "bmm", "addmm", "baddbmm", "mv", "addmv", "dot",
                         "matmul"})
_ADDS = frozenset({"add", "sub"})
_PRODUCTS = frozenset({"mul", "div"})
_FACTORS = frozenset({"alpha", "beta", "other"})  # keyword operands scaled by their size
_DEPTH = 6  # views and additions followed back at most this far


def _kind(node: fx.Node) -> str | None:
    if node.op != "call_function":
        return None
    name = op_name(node)
    for kind in (_VIEWS, _REDUCTIONS, _ADDS, _PRODUCTS):
        if name in kind:
            return name
    return None


def _norm_stat(node: fx.Node) -> fx.Node | None:
    """The ``native_layer_norm`` or ``var_mean`` whose statistic ``node`` is, else None."""
    if node.op != "call_function" or node.target is not operator.getitem:
        return None
    src, index = node.args[0], node.args[1]
    if not isinstance(src, fx.Node):
        return None
    if op_name(src) == "native_layer_norm" and index in (1, 2):
        return src
    return src if op_name(src) == "var_mean" and index in (0, 1) else None


def _norm_scale(node: fx.Node, norm: fx.Node, value_of: Callable[[fx.Node], Any]
                ) -> torch.Tensor | None:
    """A mean: ``mean(|x|)``; a variance: ``mean(x²)``; an rstd: ``rstd · mean(x²) · rstd²``.

    A variance is a difference of ``mean(x²)`` and ``mean(x)²``: its rounding is
    relative to ``mean(x²)``, so an rstd's is ``rstd · mean(x²) / var``.
    """
    x, value = value_of(norm.args[0]), value_of(node)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() \
            or not isinstance(value, torch.Tensor):
        return None
    if op_name(norm) == "native_layer_norm":
        dims = tuple(range(x.dim() - len(norm.args[1]), x.dim()))
    else:
        dims = tuple(norm.args[1]) if len(norm.args) > 1 and norm.args[1] is not None \
            else tuple(range(x.dim()))
    x = x.detach()
    if node.args[1] == 1:
        return x.abs().mean(dim=dims, keepdim=True).reshape(value.shape)
    square = x.square().mean(dim=dims, keepdim=True).reshape(value.shape)
    if op_name(norm) == "var_mean":
        return square
    return value.abs() * square * value.square()


def scale_reads(node: fx.Node, depth: int = _DEPTH) -> set[str]:
    """Names of the nodes whose values :func:`produced_scale` of ``node`` reads."""
    if (norm := _norm_stat(node)) is not None:
        return {norm.args[0].name, node.name}
    if depth > 0 and (src := backward_source(node)) is not None:
        dy = src.args[0]
        return backward_reads(node, src) | (scale_reads(dy, depth - 1)
                                            if isinstance(dy, fx.Node) else set())
    kind = _kind(node) if depth > 0 else None
    if kind is None:
        return {node.name}
    out: set[str] = set()
    for arg in node.all_input_nodes:
        out |= scale_reads(arg, depth - 1) if kind not in _PRODUCTS or arg is node.args[0] \
            else {arg.name}
    return out


def _abs(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().abs() if value.is_floating_point() else value
    return abs(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def produced_scale(node: fx.Node, value_of: Callable[[fx.Node], Any],
                   depth: int = _DEPTH) -> torch.Tensor | None:
    """The magnitudes that produced ``node``'s value, elementwise (same shape as the value).

    Args:
        node: A graph node whose value is judged.
        value_of: The value of a node of the same graph (None when unknown).
        depth: How far views and additions are followed back.

    Returns:
        A non-negative tensor shaped like ``node``'s value, or None when a
        value it needs is unknown or the op cannot be evaluated on magnitudes.
    """
    if (norm := _norm_stat(node)) is not None:
        return _norm_scale(node, norm, value_of)
    if depth > 0 and (src := backward_source(node)) is not None:
        out = backward_scale(node, src, value_of,
                             lambda dy: produced_scale(dy, value_of, depth - 1))
        if out is not None:
            return out
    kind = _kind(node) if depth > 0 else None
    if kind is None:
        value = value_of(node)
        return value.detach().abs() if isinstance(value, torch.Tensor) \
            and value.is_floating_point() else None

    def scale(arg: Any) -> Any:
        if not isinstance(arg, fx.Node):  # a scalar operand's size; a dimension as it is
            return _abs(arg) if kind in _ADDS or kind in _PRODUCTS else arg
        if kind in _PRODUCTS and arg is not node.args[0]:
            return _abs(value_of(arg))  # the factor's size, not how it was made
        return produced_scale(arg, value_of, depth - 1)

    args = [scale(a) for a in node.args]
    if any(isinstance(a, fx.Node) and s is None for a, s in zip(node.args, args)):
        return None
    kwargs = {k: _abs(v) if k in _FACTORS else v for k, v in node.kwargs.items()
              if not isinstance(v, fx.Node)}
    target = node.target
    if kind == "sub":  # |a| + |alpha|·|b|
        target = getattr(torch.ops.aten.add, op_parts(node.target)[2])
    try:
        with torch.no_grad():
            out = target(*args, **kwargs)
    except (RuntimeError, TypeError, ValueError, NotImplementedError):  # other arguments wanted
        return None
    return out.abs() if isinstance(out, torch.Tensor) and out.is_floating_point() else None
