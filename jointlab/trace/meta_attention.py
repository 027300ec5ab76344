"""Record the attention calls a trace made on the meta device (for the meta-attention pass).

On the meta device ``F.scaled_dot_product_attention`` has no fused kernel to
choose, so it decomposes into the math path. While tracing,
:func:`meta_attention_calls` records every SDPA call on meta tensors the user's
code makes (a handler of :mod:`jointlab.trace.function_checks`, active around
``train_fn`` and checkpoint's recompute); after tracing, the pass
:func:`jointlab.passes.meta_attention.flag_meta_attention` checks them and
records the needless math paths on the graph.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch.nn.functional as F

from jointlab.trace.function_checks import trace_handlers


def _recorder(calls: list[dict[str, Any]]):
    def record(_func: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        if args and args[0].device.type == "meta":
            calls.append(_signature(args, kwargs))
    return record


def _signature(args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    q, k, v = args[:3]
    mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
    return {"q": tuple(q.shape), "k": tuple(k.shape), "v": tuple(v.shape), "dtype": q.dtype,
            "mask": None if mask is None else (tuple(mask.shape), mask.dtype),
            "kwargs": {n: kwargs[n] for n in ("dropout_p", "is_causal", "scale", "enable_gqa")
                       if n in kwargs}}


@contextlib.contextmanager
def meta_attention_calls() -> Iterator[list[dict[str, Any]]]:
    """Record the signature of every SDPA call on meta tensors inside the block.

    Yields:
        The list the signatures are appended to.
    """
    calls: list[dict[str, Any]] = []
    with trace_handlers({F.scaled_dot_product_attention: _recorder(calls)}):
        yield calls
