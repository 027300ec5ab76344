"""Say so when attention on the meta device took the math path only because of meta.

On the meta device ``F.scaled_dot_product_attention`` has no fused kernel to
choose, so it decomposes into the math path: ``S x S`` score and probability
matrices that a CPU or GPU run never materialises, and a meta trace
over-predicts attention memory. While tracing, :func:`meta_attention_calls`
records every SDPA call on meta tensors; after tracing,
:func:`flag_meta_attention` checks on throw-away CPU fakes whether the same
call takes a fused kernel on CPU and, if so, warns with
:class:`jointlab.errors.MetaAttentionWarning` and records the calls on the
graph (``graph_module.meta["jointlab_meta_attention"]``; read it with
:func:`meta_attention_notes`). The remedy is :func:`jointlab.runtime.fakes.fake_cpu`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from jointlab.errors import MetaAttentionWarning

if TYPE_CHECKING:
    from jointlab.core import TracedGraph

GRAPH_KEY = "jointlab_meta_attention"
_FUSED = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
          "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
          "_scaled_dot_product_fused_attention_overrideable")


class _SdpaRecorder(TorchFunctionMode):
    def __init__(self, calls: list[dict[str, Any]]) -> None:
        super().__init__()
        self.calls = calls

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and args and args[0].device.type == "meta":
            self.calls.append(_signature(args, kwargs))
        return func(*args, **kwargs)


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
    with _SdpaRecorder(calls):
        yield calls


def fused_on_cpu(sig: dict[str, Any]) -> bool:
    """Whether SDPA with this signature takes a fused kernel on CPU (checked on fakes)."""
    from jointlab.torch_compat import FakeTensorMode, make_fx

    def attend(q, k, v, *mask):
        return F.scaled_dot_product_attention(q, k, v, *mask, **sig["kwargs"])

    mode = FakeTensorMode()
    shapes = [(sig["q"], sig["dtype"]), (sig["k"], sig["dtype"]), (sig["v"], sig["dtype"])]
    shapes += [sig["mask"]] if sig["mask"] is not None else []
    with mode:
        fakes = [torch.empty(s, dtype=d) for s, d in shapes]
        gm = make_fx(attend)(*fakes)
    return any(getattr(n.target, "__name__", "").split(".")[0] in _FUSED
               for n in gm.graph.nodes if n.op == "call_function")


def flag_meta_attention(joint: TracedGraph, calls: list[dict[str, Any]]) -> None:
    """Warn and record on the graph when meta attention took the math path needlessly.

    Args:
        joint: The traced graph.
        calls: What :func:`meta_attention_calls` recorded during its trace.
    """
    distinct = {repr(c): c for c in calls}
    fused = {key: fused_on_cpu(c) for key, c in distinct.items()}
    flagged = [c for c in calls if fused[repr(c)]]
    if not flagged:
        return
    joint.graph_module.meta[GRAPH_KEY] = [
        {"q_shape": c["q"], "k_shape": c["k"], "dtype": str(c["dtype"])} for c in flagged]
    warnings.warn(MetaAttentionWarning(
        f"{len(flagged)} attention call(s) (q {flagged[0]['q']}) took SDPA's math path only "
        "because the trace ran on the meta device: the graph materialises S x S score "
        "matrices that a CPU or GPU run never allocates, so predicted memory is too high. "
        "Trace inside `with jl.fake_cpu():` (mode='make_fx') to get the fused kernel."),
        stacklevel=3)


def meta_attention_notes(joint: TracedGraph) -> list[dict[str, Any]]:
    """The attention calls that took the math path only because of meta (empty if none).

    Args:
        joint: A traced graph.

    Returns:
        One dict per flagged call: ``q_shape``, ``k_shape``, ``dtype``.
    """
    return list(joint.graph_module.meta.get(GRAPH_KEY, []))
