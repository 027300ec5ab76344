"""Pass: flag attention that took the math path only because the trace ran on meta.

On the meta device ``F.scaled_dot_product_attention`` has no fused kernel to
choose, so it decomposes into the math path: ``S x S`` score and probability
matrices that a CPU or GPU run never materialises, and a meta trace
over-predicts attention memory. Given the SDPA calls the tracer recorded
(:func:`jointlab.trace.meta_attention.meta_attention_calls`),
:func:`flag_meta_attention` checks on throw-away CPU fakes whether the same
call takes a fused kernel on CPU and, if so, warns with
:class:`jointlab.errors.MetaAttentionWarning` and records the calls on the graph.
Read them with :func:`meta_attention_notes`. The remedy is :func:`jointlab.runtime.fakes.fake_cpu`.

Writes (graph-level, not per node): ``graph_module.meta["jointlab_meta_attention"]``.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from jointlab.errors import MetaAttentionWarning, user_stacklevel

if TYPE_CHECKING:
    from jointlab.core import TracedGraph

__all__ = ["GRAPH_KEY", "flag_meta_attention", "fused_on_cpu", "meta_attention_notes"]

GRAPH_KEY = "jointlab_meta_attention"
_FUSED = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
          "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
          "_scaled_dot_product_fused_attention_overrideable")


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


def flag_meta_attention(gm: fx.GraphModule, calls: list[dict[str, Any]]) -> None:
    """Warn and record on the graph when meta attention took the math path needlessly.

    Args:
        gm: The traced joint graph.
        calls: What :func:`meta_attention_calls` recorded during its trace.
    """
    distinct = {repr(c): c for c in calls}
    fused = {key: fused_on_cpu(c) for key, c in distinct.items()}
    flagged = [c for c in calls if fused[repr(c)]]
    if not flagged:
        return
    gm.meta[GRAPH_KEY] = [
        {"q_shape": c["q"], "k_shape": c["k"], "dtype": str(c["dtype"])} for c in flagged]
    warnings.warn(MetaAttentionWarning(
        f"{len(flagged)} attention call(s) (q {flagged[0]['q']}) took SDPA's math path only "
        "because the trace ran on the meta device: the graph materialises S x S score "
        "matrices that a CPU or GPU run never allocates, so predicted memory is too high. "
        "Trace inside `with jl.fake_cpu():` (mode='make_fx') to get the fused kernel."),
        stacklevel=user_stacklevel())


def meta_attention_notes(joint: TracedGraph) -> list[dict[str, Any]]:
    """The attention calls that took the math path only because of meta (empty if none).

    Args:
        joint: A traced graph.

    Returns:
        One dict per flagged call: ``q_shape``, ``k_shape``, ``dtype``.
    """
    return list(joint.graph_module.meta.get(GRAPH_KEY, []))
