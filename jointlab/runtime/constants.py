"""The constants baked into a traced graph: fresh literals and a library's own placeholders.

Read by the tracer (:mod:`jointlab.trace.python_state` warns about baked
values) and by :mod:`jointlab.analysis.inductor_graph` (which names a constant
Inductor cannot take), so they live below both. A plug-in
(``jointlab/plugins/``) registers the empty constants its library's code
makes (:class:`LibraryConstant`: HF's KV cache), so they are named with the fix.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.fx as fx

__all__ = ["LibraryConstant", "graph_constant", "is_fresh_literal", "is_scalar_literal",
           "library_constant", "register_library_constants", "without_library_constants"]


@dataclass(frozen=True)
class LibraryConstant:
    """Empty constants a library's own code puts into a graph (registered by a plug-in).

    Attributes:
        label: Named next to the constant (``"HF's KV cache: use_cache=True"``).
        made_by: Whether a stack trace of a node reading the constant shows the library made it.
        what: What happened, as the trace's warning says it (``"the model fills a KV cache"``).
        fix: What to do (``"pass use_cache=False to the model call in train_fn"``).
    """

    label: str
    made_by: Callable[[str], bool]
    what: str
    fix: str


_LIBRARY_CONSTANTS: dict[str, tuple[LibraryConstant, ...]] = {}


def register_library_constants(plugin: str, kinds: tuple[LibraryConstant, ...]) -> None:
    """Have the tracer and compile name a library's empty constants (again: replaces).

    Args:
        plugin: The registering plug-in's name.
        kinds: How to recognise and name them.
    """
    _LIBRARY_CONSTANTS[plugin] = tuple(kinds)


@contextlib.contextmanager
def without_library_constants(plugin: str) -> Iterator[None]:
    """Leave one plug-in's constants unnamed inside the block (put back after).

    Args:
        plugin: A plug-in's name (nothing happens if it registered none).

    Yields:
        Nothing.
    """
    kinds = _LIBRARY_CONSTANTS.pop(plugin, None)
    try:
        yield
    finally:
        if kinds is not None:
            _LIBRARY_CONSTANTS[plugin] = kinds


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


def library_constant(gm: fx.GraphModule, node: fx.Node) -> LibraryConstant | None:
    """The registered library that made ``node``, an empty fresh literal; else None.

    Args:
        gm: The graph.
        node: A node of it.

    Returns:
        The first registered :class:`LibraryConstant` whose code made it, or None.
    """
    t = graph_constant(gm, node)
    if not (is_fresh_literal(gm, node) and t.numel() == 0):
        return None
    traces = [u.meta.get("stack_trace") or "" for u in node.users]
    return next((k for kinds in _LIBRARY_CONSTANTS.values() for k in kinds
                 if any(map(k.made_by, traces))), None)
