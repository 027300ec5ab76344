"""Breakpoints of the :class:`jointlab.Stepper` and the node predicates they use."""

from __future__ import annotations

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
def draws_random(node: fx.Node) -> bool:
    """True when the op is tagged as consuming the global RNG."""
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


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
