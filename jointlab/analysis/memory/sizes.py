"""Concrete sizes of a dynamic graph's values at the sizes of given inputs.

A dynamic trace stores every node value with symbolic sizes; the analyses
read their trace-time hints. :class:`Sizes` evaluates them instead with the
symbol values that a call's inputs bind (the same binding
:meth:`jointlab.shape_guards.ShapeGuards.validate` checks), so a memory prediction
can be for the sizes the user runs, not the ones traced. :func:`round_alloc`
gives the bytes an allocator really reserves for a size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sympy
import torch

from jointlab.errors import ValueNotAvailableError
from jointlab.meta import node_info
from jointlab.passes.analyze import hint, tensors_of

if TYPE_CHECKING:
    import torch.fx as fx

    from jointlab.core import TracedGraph


_CUDA_BLOCK = 512  # the CUDA caching allocator rounds every block up to this


def round_alloc(nbytes: int, device: str) -> int:
    """Bytes the allocator of ``device`` really reserves for ``nbytes``.

    Args:
        nbytes: Bytes asked for.
        device: Device type, e.g. ``cpu`` or ``cuda:0``.

    Returns:
        ``nbytes`` rounded up to the allocator's block size (CUDA: 512 B).
    """
    if device.startswith("cuda") and nbytes > 0:
        return math.ceil(nbytes / _CUDA_BLOCK) * _CUDA_BLOCK
    return nbytes


@dataclass
class Sizes:
    """Evaluates symbolic sizes with fixed symbol values.

    Attributes:
        subs: Symbol to its value for this call.
        inputs: The tensor input sizes these values come from, by dotted path.
    """

    subs: dict[sympy.Symbol, sympy.Integer]
    inputs: dict[str, tuple[int, ...]]

    def int(self, x: Any) -> int:
        """A size (int or SymInt) at these input sizes."""
        if not isinstance(x, torch.SymInt):
            return int(x)
        node = x.node
        env = getattr(node, "shape_env", None)
        expr = env.replace(node.expr) if env is not None else node.expr
        value = sympy.sympify(expr).xreplace(self.subs)
        if not value.is_number:
            raise ValueNotAvailableError(
                f"a size of the graph ({expr}) depends on symbols no input binds "
                f"({sorted(map(str, value.free_symbols))}); predict at the traced sizes "
                "(joint.memory() without inputs) instead."
            )
        return int(value)

    def tensor_bytes(self, t: torch.Tensor) -> int:
        """Bytes of ``t``'s elements at these sizes."""
        return self.int(t.numel()) * t.element_size()

    def out_bytes(self, node: fx.Node) -> int:
        """Bytes of a node's output value(s) at these sizes."""
        return sum(self.tensor_bytes(t) for t in tensors_of(node.meta.get("val")))

    def shape(self, node: fx.Node) -> tuple[int, ...] | None:
        """Shape of the node's (first) output at these sizes."""
        ts = tensors_of(node.meta.get("val"))
        return tuple(self.int(s) for s in ts[0].shape) if ts else None


def traced_sizes(joint: TracedGraph) -> dict[str, tuple[int, ...]]:
    """Tensor input sizes at trace time, by dotted path (empty if unknown)."""
    guards = getattr(joint, "shape_guards", None)
    if guards is not None:
        return dict(guards.traced_sizes)
    out = {}
    for node in joint.graph_module.graph.find_nodes(op="placeholder"):
        path = node_info(node).input_path
        val = node.meta.get("val")
        if path and isinstance(val, torch.Tensor):
            out[path] = tuple(hint(s) for s in val.shape)
    return out


def sizes_for(joint: TracedGraph, tensors: dict[str, torch.Tensor]) -> Sizes | None:
    """The :class:`Sizes` of a call, or None when the graph is static.

    Args:
        joint: The traced graph.
        tensors: The call's tensor inputs by dotted path.

    Returns:
        None for a static trace (its sizes are the only ones it runs at).

    Raises:
        GuardError: The sizes break an assumption of the trace.
    """
    guards = getattr(joint, "shape_guards", None)
    if guards is None:
        return None
    bindings = guards.validate(tensors)
    return Sizes({k: sympy.Integer(v) for k, v in bindings.items()},
                 {p: tuple(t.shape) for p, t in tensors.items()})
