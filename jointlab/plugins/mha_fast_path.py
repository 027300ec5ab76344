"""The MHA fast-path plug-in: refuse modules eager would run through PyTorch's fused kernel.

``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention`` in eval mode,
when nothing they touch needs a gradient, skip their Python code and run one
fused kernel (``torch._transformer_encoder_layer_fwd``,
``torch._native_multi_head_attention``); ``nn.TransformerEncoder`` with a
padding mask even turns its input into a nested tensor that zeroes padded
positions. Under tracing those conditions fail (tracing tensors and
jointlab's own module hooks both turn the fast path off), so the graph holds
the ordinary path: other values than eager's, with no warning, and the
Stepper would reproduce the graph, so it would look right.

:func:`fast_path_refusals` checks, on each such module's call while
tracing, the conditions eager checks (``torch.backends.mha`` setting,
training flag, shapes, layout, autocast, ``requires_grad``) and raises
:class:`~jointlab.errors.FastPathError` where eager would take the fast path.
The setting and the training flags are also recorded as guards
(:mod:`jointlab.assumptions`), so a later ``model.eval()`` is refused too.

The plug-in registers one row of the watch table, "fused fast path". The
conditions copy eager's (``nn.MultiheadAttention.forward``,
``nn.TransformerEncoderLayer.forward``) and must follow them when torch changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from jointlab.errors import FastPathError
from jointlab.trace.watch_table import Watch

__all__ = ["AFTER", "NAME", "ROWS", "attention_takes_fast_path",
           "encoder_layer_takes_fast_path", "fast_path_refusals"]

_DEVICES = ("cpu", "cuda", "hpu", "xpu")
_HOW = ("Either keep it in training mode (model.train(); set its dropout to 0 for "
        "eval-like numbers), let one of its parameters require grad, or turn the fast path "
        "off for eager and the graph alike with torch.backends.mha.set_fastpath_enabled(False) "
        "before jl.trace and every run.")


def _tensors_allow(tensors: list[Any]) -> bool:
    """Eager's checks on the tensors: devices, and no gradient wanted in grad mode."""
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    if not all(t.device.type in _DEVICES for t in tensors):
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def _attention_allows(mha: nn.MultiheadAttention, query: torch.Tensor) -> bool:
    """The module-level conditions ``MultiheadAttention`` shares with the encoder layer."""
    return (mha.batch_first and mha.in_proj_bias is not None and mha.in_proj_weight is not None
            and mha.kdim == mha.embed_dim == mha.vdim and mha.num_heads % 2 == 0
            and not mha.training and query.dim() == 3
            and query.dtype == mha.in_proj_weight.dtype)


def encoder_layer_takes_fast_path(layer: nn.TransformerEncoderLayer, src: Any) -> bool:
    """Whether eager runs ``layer(src, ...)`` through the fused fast path.

    Args:
        layer: The encoder layer.
        src: Its input.

    Returns:
        True where eager's own checks would all pass.
    """
    if not isinstance(src, torch.Tensor) or layer.training or torch.is_autocast_enabled():
        return False
    if not (_attention_allows(layer.self_attn, src)
            and getattr(layer, "activation_relu_or_gelu", False)
            and layer.norm1.eps == layer.norm2.eps):
        return False
    mha = layer.self_attn
    return _tensors_allow([src, mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight,
                           mha.out_proj.bias, layer.norm1.weight, layer.norm1.bias,
                           layer.norm2.weight, layer.norm2.bias, layer.linear1.weight,
                           layer.linear1.bias, layer.linear2.weight, layer.linear2.bias])


def attention_takes_fast_path(mha: nn.MultiheadAttention, query: Any, key: Any,
                              value: Any) -> bool:
    """Whether eager runs ``mha(query, key, value, ...)`` through the fused fast path.

    Args:
        mha: The attention module.
        query: Its query.
        key: Its key.
        value: Its value.

    Returns:
        True where eager's own checks would all pass.
    """
    if not isinstance(query, torch.Tensor) or query is not key or key is not value:
        return False
    if torch.is_autocast_enabled() or mha.bias_k is not None or mha.add_zero_attn:
        return False
    if not _attention_allows(mha, query):
        return False
    return _tensors_allow([query, mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight,
                           mha.out_proj.bias])


def _refuse(name: str, mod: nn.Module, kernel: str) -> None:
    raise FastPathError(
        f"'{name}' ({type(mod).__name__}) is in eval mode and nothing it uses requires "
        f"grad, so eager runs PyTorch's fused fast path ({kernel}; with a padding mask, "
        "nested tensors that zero padded positions), which a joint graph cannot hold: "
        f"the graph would compute the ordinary path and differ from eager. {_HOW}"
    )


def _hook(name: str):
    def pre_hook(mod: nn.Module, args: tuple, kwargs: dict) -> None:
        if not torch.backends.mha.get_fastpath_enabled():
            return
        first = args[0] if args else kwargs.get("src", kwargs.get("query"))
        if isinstance(mod, nn.TransformerEncoderLayer):
            if encoder_layer_takes_fast_path(mod, first):
                _refuse(name, mod, "torch._transformer_encoder_layer_fwd")
            return
        key = args[1] if len(args) > 1 else kwargs.get("key")
        value = args[2] if len(args) > 2 else kwargs.get("value")
        if attention_takes_fast_path(mod, first, key, value):
            _refuse(name, mod, "torch._native_multi_head_attention")
    return pre_hook


@contextlib.contextmanager
def fast_path_refusals(model: nn.Module) -> Iterator[None]:
    """Refuse, while tracing, each call eager would run through the fused fast path.

    Args:
        model: The user's model.

    Yields:
        Nothing; the hooks are removed when the block exits.
    """
    kinds = (nn.TransformerEncoderLayer, nn.MultiheadAttention)
    with contextlib.ExitStack() as hooks:  # each hook handle removes itself on exit
        for name, mod in model.named_modules():
            if isinstance(mod, kinds):
                hooks.enter_context(mod.register_forward_pre_hook(_hook(name), with_kwargs=True))
        yield


NAME = "mha fast path"
#: The table row the plug-in's rows follow.
AFTER = "random ops"
ROWS: tuple[Watch, ...] = (
    Watch("fused fast path", "eval-mode MultiheadAttention eager would run fused", "refuse",
          FastPathError, "the fused kernel computes other bits than the traced ops",
          lambda c: fast_path_refusals(c.model)),
)
