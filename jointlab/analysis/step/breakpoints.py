"""Breakpoints of the :class:`jointlab.Stepper` and the node predicates they use."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from jointlab import meta as _meta
from jointlab.passes.analyze import tensors_of
from jointlab.passes.annotate import is_compute
from jointlab.torch_compat import is_op_overload, op_schema


# -- small predicates ----------------------------------------------------------
def in_module(node: fx.Node, prefix: str) -> bool:
    """True when the node belongs to ``prefix`` or one of its submodules (either phase)."""
    mod = _meta.module(node)
    return mod == prefix or mod.startswith(prefix + ".")


def op_names(node: fx.Node) -> set[str]:
    """Names an ``op=`` breakpoint may use: ``aten.mm.default``, ``aten.mm``, ``mm``."""
    target = node.target
    names = {str(target), getattr(target, "__name__", "")}
    if is_op_overload(target):
        base = op_schema(target).name.split("::")[-1]
        names |= {f"{target.namespace}.{base}", base}
    return names - {""}


def draws_random(node: fx.Node) -> bool:
    """True when the op is tagged as consuming the global RNG."""
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


def non_finite(value: Any) -> bool:
    """True when a floating tensor in ``value`` holds a NaN or an infinity."""
    return any(t.is_floating_point() and not bool(torch.isfinite(t).all())
               for t in tensors_of(value))


# -- breakpoints ---------------------------------------------------------------
@dataclass
class Breakpoint:
    """Stop condition: a node name, a module prefix, an op, and/or a value predicate.

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
        if self.module is not None and not in_module(node, self.module):
            return False
        return self.op is None or self.op in op_names(node)


def _predicate(when: Any) -> Callable[[Any], bool] | None:
    if when is None or callable(when):
        return when
    if when in ("nonfinite", "non-finite", "nan"):
        return non_finite
    raise ValueError(f"when= must be a callable or 'non-finite', got {when!r}")
