"""Python values as guards hold them: plain data, compared the way the graph would differ.

A guard stores what the trace read as plain data, so it survives
:func:`jointlab.save` and shows in ``joint.guards``. :func:`plain_form` turns a
value into that form (numbers, strings, bools, None, dtypes, devices, enum
members, and tuples, lists and dicts of those); anything else has no plain
form and is not a value guard. :func:`same_form` compares two forms the way a
traced graph would tell them apart: a NaN equals a NaN (a NaN attribute is the
same attribute on every run), ``0`` equals ``0.0`` (a Python number enters an
op as a scalar either way), and ``True`` never equals ``1``.

A plain tensor a trace reads (a module attribute that is no buffer, a tensor
in ``train_fn``'s closure) is baked into the graph as a constant, so it is
guarded by value: :func:`tensor_form` holds its dtype, shape and values (a
digest of its bytes when large). It reads data, so it is computed outside the
trace's fake mode (after the trace, and on each run).
"""

from __future__ import annotations

import enum
import hashlib
import math
from typing import Any

import torch

__all__ = ["NO_FORM", "plain_form", "same_form", "tensor_form", "value_form"]

_SCALARS = (bool, int, float, str, type(None))
_MAX_ITEMS = 256  # a larger container is held by a digest of its items
_MAX_DEPTH = 4


class _NoForm:
    def __repr__(self) -> str:
        return "(no plain form)"


#: What :func:`plain_form` returns for a value a guard cannot hold as data.
NO_FORM: Any = _NoForm()


def _digest_form(value: Any) -> Any:
    """A large or deep container of plain values, held by its length and a digest."""
    if len(value) > 1_000_000:
        return NO_FORM
    forms = _items_form(value, 0, limits=False)
    if forms is NO_FORM:
        return NO_FORM
    digest = hashlib.sha1(repr(forms).encode()).hexdigest()
    return {"container": type(value).__name__, "items": len(value), "sha1": digest}


def _container_form(value: Any, depth: int, limits: bool = True) -> Any:
    form = _items_form(value, depth, limits)
    if form is NO_FORM and limits and depth == 0:  # too large or deep to show: a digest
        return _digest_form(value)
    return form


def _items_form(value: Any, depth: int, limits: bool) -> Any:
    if limits and (len(value) > _MAX_ITEMS or depth >= _MAX_DEPTH):
        return NO_FORM
    if isinstance(value, dict):
        if not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in value):
            return NO_FORM
        items = {k: plain_form(v, depth + 1, limits) for k, v in value.items()}
        return NO_FORM if any(v is NO_FORM for v in items.values()) else items
    forms = [plain_form(v, depth + 1, limits) for v in value]
    if any(f is NO_FORM for f in forms):
        return NO_FORM
    return tuple(forms) if isinstance(value, tuple) else forms


def plain_form(value: Any, depth: int = 0, limits: bool = True) -> Any:
    """``value`` as plain data a guard can store, or :data:`NO_FORM`.

    Args:
        value: Any Python value.
        depth: Nesting depth (for containers; callers leave it 0).
        limits: Hold a container of more than 256 items, or nested deeper than 4,
            by its length and a digest of its items' forms (the default); False: in full.

    Returns:
        The value itself for numbers, strings, bools, None, dtypes and devices;
        ``"Color.RED"`` for an enum member; tuples, lists and dicts (str or int keys)
        of those, converted item by item (a large or deep one as ``{"container",
        "items", "sha1"}``); :data:`NO_FORM` for anything else.
    """
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (torch.dtype, torch.device)):
        return value
    if type(value) in (tuple, list, dict):
        return _container_form(value, depth, limits)
    return NO_FORM


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def same_form(a: Any, b: Any) -> bool:
    """Whether two plain forms would give the same traced graph.

    Args:
        a: A form from :func:`plain_form` (or a decoded archive).
        b: Another.

    Returns:
        True when equal, NaN matching NaN and ``int``/``float`` compared by value.
    """
    if _is_number(a) and _is_number(b):
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True
        return a == b
    if type(a) is not type(b):  # True is never 1, a str never a number
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same_form(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_form(a[k], b[k]) for k in a)
    return a == b


_SMALL = 64  # a tensor of at most this many elements is held by its values


def tensor_form(t: Any) -> dict[str, Any]:
    """A plain tensor as a guard holds it: dtype, shape, and its values or their digest.

    Args:
        t: A real (not fake) tensor; a meta tensor is held by dtype and shape only.

    Returns:
        ``{"tensor": dtype, "shape": [...], "values": [...]}`` for a small tensor,
        ``"sha1"`` of its bytes instead of ``"values"`` for a larger one.
    """
    form: dict[str, Any] = {"tensor": str(t.dtype).removeprefix("torch."),
                            "shape": list(t.shape)}
    if t.device.type == "meta":
        return form
    data = t.detach().cpu().contiguous()
    if data.numel() <= _SMALL and not data.is_complex():
        form["values"] = data.flatten().tolist()
    else:
        form["sha1"] = hashlib.sha1(data.view(-1).view(torch.uint8).numpy().tobytes()
                                    ).hexdigest()
    return form


def value_form(value: Any) -> Any:
    """:func:`plain_form`, or :func:`tensor_form` for a plain tensor (outside a trace only)."""
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        return tensor_form(value)
    return plain_form(value)
