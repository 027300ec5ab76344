"""Layout drift: where a real run's strides left the ones the trace saw.

A few ATen ops lay out their real output differently from their fake (meta)
one (:data:`jointlab.passes.repair.STRIDE_UNCERTAIN`: batch norm on a
transposed input returns a contiguous tensor on CPU, the meta kernel keeps
the input's strides). Composite ops later in eager branch on layout: ``linear``
on a contiguous 3-D input is one ``addmm``, on a non-contiguous one a ``mm``
followed by an add. The trace recorded the branch the fake strides chose, so
where real strides drift, graph and eager may run different kernels and round
differently, although both are right. :func:`layout_drift` finds such nodes
after a run, so that ``jl.compare`` does not demand bitwise equality there.
"""

from __future__ import annotations

from typing import Any

import torch

from jointlab.analysis.step.runner import NodeRunner
from jointlab.core import TracedGraph
from jointlab.meta import module as node_module
from jointlab.meta import op_name
from jointlab.passes.repair import makes_uncertain


def uncertain_layout_nodes(joint: TracedGraph) -> list[str]:
    """Names of the nodes whose real output strides may differ from the traced ones."""
    return [n.name for n in joint.graph.nodes if makes_uncertain(n)]


def _tensors(value: Any) -> list[torch.Tensor]:
    items = value if isinstance(value, (tuple, list)) else [value]
    return [t for t in items if isinstance(t, torch.Tensor)]


def _drifted(fake: Any, real: Any) -> bool:
    """True when a real output's strides differ from the traced value's (where both exist)."""
    pairs = zip(_tensors(fake), _tensors(real))
    return any(f.dim() == r.dim() and f.numel() > 1 and tuple(f.stride()) != tuple(r.stride())
               for f, r in pairs)


def layout_drift(joint: TracedGraph, runner: NodeRunner) -> list[str]:
    """Describe each stride-uncertain node whose real strides differ from the trace's.

    Args:
        joint: The traced graph.
        runner: A runner that has run past those nodes and kept their values
            (pass :func:`uncertain_layout_nodes` in its ``keep``).

    Returns:
        One line per drifted node, e.g. ``"native_batch_norm in module 'bn'"``; empty
        when every real layout is the traced one or no value was kept.
    """
    out = []
    for n in joint.graph.nodes:
        if not makes_uncertain(n):
            continue
        real = runner.lookup(n)
        if real is not None and _drifted(n.meta.get("val"), real):
            named = n.name if n.name == op_name(n) else f"{n.name} ({op_name(n)})"
            out.append(f"{named} in module {node_module(n)!r}")
    return out
