"""Private ATen overloads and op namespaces jointlab names, in one place.

ATen's underscore-prefixed overloads and torch's ``_c10d_functional`` op
namespace are not public API: they are named only here, so a torch that
renames them breaks one module, not every pass that reads a graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["COLLECTIVE_NAMESPACES", "FUNCTIONAL_COLLECTIVES", "batch_norm_legit_overloads",
           "flop_formula", "is_collective_op", "is_functional_collective"]

#: The op namespace of torch's functional collectives (``all_reduce``, ``wait_tensor``...).
FUNCTIONAL_COLLECTIVES = "_c10d_functional"
#: Every namespace whose ops are collectives: functional, legacy functional, in-place c10d.
COLLECTIVE_NAMESPACES = (FUNCTIONAL_COLLECTIVES, "c10d_functional", "c10d")


#: Ops torch's FLOP counter learnt late (2.15: CPU flash attention), mapped to the op
#: whose formula torch 2.15 registers for them too (``sdpa_flop``, ``sdpa_backward_flop``:
#: same leading ``query, key, value`` / ``grad_out, query, key, value`` arguments).
_FLOP_SIBLINGS = {
    "_scaled_dot_product_flash_attention_for_cpu": "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu_backward":
        "_scaled_dot_product_flash_attention_backward",
}


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


def flop_formula(packet: Any) -> Callable[..., Any] | None:
    """The FLOP formula of an op packet: torch's, else the one a newer torch registers.

    Before 2.15 ``torch.utils.flop_counter`` has no formula for CPU flash
    attention (forward and backward); this gives the formula 2.15 uses for
    them, torch's own for the CUDA flash-attention op of the same arguments.

    Args:
        packet: An ``OpOverloadPacket`` (``node.target.overloadpacket``).

    Returns:
        The registered formula, or None when neither torch nor the backfill has one.
    """
    from torch.utils.flop_counter import flop_registry  # not at import: jointlab stays light

    fn = flop_registry.get(packet)
    if fn is not None:
        return fn
    name = getattr(packet, "__name__", "")
    sibling = _FLOP_SIBLINGS.get(name)
    if sibling is None or getattr(torch.ops.aten, name, None) is not packet:
        return None
    return flop_registry.get(getattr(torch.ops.aten, sibling))
