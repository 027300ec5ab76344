"""Breakpoints of the :class:`jointlab.Stepper` and the node predicates they use."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from jointlab import meta as _meta
from jointlab.errors import StepperError
from jointlab.passes.analyze import tensors_of
from jointlab.passes.annotate import is_compute


# -- small predicates ----------------------------------------------------------
def non_finite(value: Any) -> bool:
    """True when a floating tensor in ``value`` holds a NaN or an infinity."""
    return any(t.is_floating_point() and not bool(torch.isfinite(t).all())
               for t in tensors_of(value))


# -- breakpoints ---------------------------------------------------------------
@dataclass(repr=False)
class Breakpoint:
    """Stop condition: a node name, a module prefix, an op, and/or a value predicate.

    ``None`` leaves a part out (any node, any module, any op); ``module=""``
    selects the root module's own nodes (:func:`jointlab.meta.in_module`).

    Static parts are ANDed; without ``when`` the stepper stops *before* a
    matching node, with ``when`` it stops *after* a matching node whose value
    satisfies the predicate. Module, op and value conditions look at compute
    nodes only (placeholders hold given values, not computed ones).
    """

    node: str | None = None
    module: str | None = None
    op: str | None = None
    when: Callable[[Any], bool] | None = None

    def selects(self, node: fx.Node) -> bool:
        """True when the static part of the breakpoint matches ``node``."""
        if self.node is not None and node.name != self.node:
            return False
        static = self.module is not None or self.op is not None or self.when is not None
        if static and self.node is None and not is_compute(node):
            return False
        if self.module is not None and not _meta.in_module(_meta.module(node), self.module):
            return False
        return self.op is None or self.op in _meta.op_aliases(node)

    def __repr__(self) -> str:
        """Only the parts that are set: ``Breakpoint(module='h.1', when=non_finite)``."""
        parts = [f"{k}={v!r}" for k, v in (("node", self.node), ("module", self.module),
                                           ("op", self.op)) if v is not None]
        if self.when is not None:
            parts.append(f"when={getattr(self.when, '__name__', 'predicate')}")
        return f"Breakpoint({', '.join(parts)})"


def _predicate(when: Any) -> Callable[[Any], bool] | None:
    if when is None or callable(when):
        return when
    if when in ("nonfinite", "non-finite", "nan"):
        return non_finite
    raise StepperError(f"when= must be a callable or 'non-finite', got {when!r}")


# -- validation ----------------------------------------------------------------
def check_breakpoint(bp: Breakpoint, nodes: list[fx.Node]) -> None:
    """Refuse a module or op breakpoint that no compute node of the graph matches.

    Without this check a misspelt name would be accepted and :meth:`Stepper.run`
    would run silently to the end.

    Args:
        bp: The breakpoint being added.
        nodes: The graph's nodes.

    Raises:
        StepperError: ``module`` or ``op`` names nothing in the graph (with the nearest names).
    """
    compute = [n for n in nodes if is_compute(n)]
    if bp.module is not None and not any(_meta.in_module(_meta.module(n), bp.module)
                                         for n in compute):
        names = _meta.module_names(_meta.module(n) for n in compute)
        top = sorted(n for n in names if n and "." not in n)  # the root's children
        hint = _meta.did_you_mean(bp.module, names, top)
        raise StepperError(f"no compute node of the graph is in module {bp.module!r}, so this "
                           f"breakpoint would never stop." + hint)
    if bp.op is not None and not any(bp.op in _meta.op_aliases(n) for n in compute):
        ops = {a for n in compute for a in _meta.op_aliases(n)
               if "<" not in a and not a.endswith(".default")}
        common = [op for op, _ in Counter(_meta.op_name(n) for n in compute).most_common()]
        raise StepperError(f"no compute node of the graph runs op {bp.op!r}, so this breakpoint "
                           f"would never stop." + _meta.did_you_mean(bp.op, ops, common))
    if not any(bp.selects(n) for n in nodes):
        raise StepperError(f"no node of the graph matches {bp!r} (each part must hold for the "
                           f"same node), so this breakpoint would never stop.")


class BreakpointList:
    """Removal of a stepper's breakpoints, kept in its ``breakpoints`` list."""

    breakpoints: list[Breakpoint]

    def remove_breakpoint(self, bp: Breakpoint) -> None:
        """Remove one breakpoint."""
        self.breakpoints.remove(bp)

    def clear_breakpoints(self) -> None:
        """Remove every breakpoint."""
        self.breakpoints.clear()
