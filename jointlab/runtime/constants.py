"""The constants baked into a traced graph: fresh literals and HF's KV-cache placeholders.

Read by the tracer (:mod:`jointlab.trace.python_state` warns about baked
values) and by :mod:`jointlab.analysis.compile` (which names a KV-cache
constant Inductor cannot take), so they live below both.
"""

from __future__ import annotations

import torch
import torch.fx as fx

__all__ = ["graph_constant", "is_fresh_literal", "is_kv_cache_placeholder", "is_scalar_literal"]


def graph_constant(gm: fx.GraphModule, node: fx.Node) -> torch.Tensor | None:
    """The tensor a ``get_attr`` node reads from ``gm``, or None for any other node."""
    t = getattr(gm, str(node.target), None) if node.op == "get_attr" else None
    return t if isinstance(t, torch.Tensor) else None


def is_fresh_literal(gm: fx.GraphModule, node: fx.Node) -> bool:
    """True for a constant made by ``torch.tensor(...)`` in the traced code.

    Such a constant is read only through ``lift_fresh_copy``; a captured
    tensor or a baked parameter is read by the ops themselves.
    """
    return (graph_constant(gm, node) is not None and bool(node.users)
            and all(u.target is torch.ops.aten.lift_fresh_copy.default for u in node.users))


def is_scalar_literal(gm: fx.GraphModule, node: fx.Node) -> bool:
    """True for a fresh literal holding one Python number (e.g. from ``x[i] = 3``)."""
    t = graph_constant(gm, node)
    return is_fresh_literal(gm, node) and t.numel() == 1 and t.dim() <= 1


def is_kv_cache_placeholder(gm: fx.GraphModule, node: fx.Node) -> bool:
    """True for an empty fresh literal created by HF's KV cache."""
    t = graph_constant(gm, node)
    return (is_fresh_literal(gm, node) and t.numel() == 0
            and any(_from_hf_cache(u.meta.get("stack_trace") or "") for u in node.users))


def _from_hf_cache(stack_trace: str) -> bool:
    return "cache_utils.py" in stack_trace or "cache.update(" in stack_trace
