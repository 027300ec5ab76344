"""Private ATen overloads and op namespaces jointlab names, in one place.

ATen's underscore-prefixed overloads and torch's ``_c10d_functional`` op
namespace are not public API: they are named only here, so a torch that
renames them breaks one module, not every pass that reads a graph.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["COLLECTIVE_NAMESPACES", "FUNCTIONAL_COLLECTIVES", "batch_norm_legit_overloads",
           "is_collective_op", "is_functional_collective"]

#: The op namespace of torch's functional collectives (``all_reduce``, ``wait_tensor``...).
FUNCTIONAL_COLLECTIVES = "_c10d_functional"
#: Every namespace whose ops are collectives: functional, legacy functional, in-place c10d.
COLLECTIVE_NAMESPACES = (FUNCTIONAL_COLLECTIVES, "c10d_functional", "c10d")


def _namespace(target: Any) -> str | None:
    return getattr(target, "namespace", None)


def is_collective_op(target: Any) -> bool:
    """True for an op of any collective namespace (:data:`COLLECTIVE_NAMESPACES`)."""
    return _namespace(target) in COLLECTIVE_NAMESPACES


def is_functional_collective(target: Any) -> bool:
    """True for an op of torch's functional collectives (``_c10d_functional``)."""
    return _namespace(target) == FUNCTIONAL_COLLECTIVES


def batch_norm_legit_overloads() -> tuple[Any, ...]:
    """The ``_native_batch_norm_legit`` overloads (training, functional, no-training) torch has."""
    aten = torch.ops.aten
    names = ("_native_batch_norm_legit", "_native_batch_norm_legit_functional",
             "_native_batch_norm_legit_no_training")
    return tuple(getattr(aten, n).default for n in names if hasattr(aten, n))
