"""Human-readable counts, byte sizes and times for cards, tables and errors.

The one home of unit formatting: :func:`human_bytes` (binary units),
:func:`human_count` (k/M/G/T, ``human_count(n, "FLOP")`` for FLOPs),
:func:`human_seconds` (s/ms/µs/ns), and :func:`column_unit`, which says which of
them a table column named by jointlab's conventions (``bytes``, ``saved_bytes``,
``flops_fwd``, ``time_s``, ``step_mem_peak``) holds. Source locations are
:mod:`jointlab.sources`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

Unit = Literal["bytes", "flops", "seconds"]


def human_count(x: float, unit: str = "") -> str:
    """Format a count with a k/M/G/T/P suffix (``1.23 GFLOP``).

    Args:
        x: The count.
        unit: Unit appended after the suffix.

    Returns:
        The formatted text.
    """
    for suffix in ("", "k", "M", "G", "T"):
        if abs(x) < 1000:
            return f"{x:.3g} {suffix}{unit}".rstrip()
        x /= 1000
    return f"{x:.3g} P{unit}".rstrip()


def human_bytes(n: float) -> str:
    """Format a byte count in binary units (``12.5 MiB``).

    Args:
        n: Bytes.

    Returns:
        The formatted text.
    """
    for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or suffix == "TiB":
            return f"{n:.0f} B" if suffix == "B" else f"{n:.3g} {suffix}"
        n /= 1024
    return f"{n:.3g} TiB"  # pragma: no cover


def human_seconds(s: float | None) -> str:
    """Format seconds as ``1.23 s``, ``45.6 ms``, ``789 µs`` or ``12 ns`` (``—`` when unknown).

    Args:
        s: Seconds, or None/NaN.

    Returns:
        The formatted text.
    """
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "—"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns" if s else "0 s"


def column_unit(name: Any) -> Unit | None:
    """The unit of a numeric table column, from its name's ``_``-separated words.

    ``flops`` (not ``flops_unknown``, a count of nodes) is FLOPs; ``bytes`` or
    ``mem`` is bytes; a last word ``s`` (``time_s``, ``step_s``, ``time_fwd_s``)
    is seconds. Anything else has no unit here.

    Args:
        name: A column label.

    Returns:
        ``"bytes"``, ``"flops"``, ``"seconds"`` or None.
    """
    if not isinstance(name, str):
        return None
    words = name.lower().split("_")
    if "flops" in words and "unknown" not in words:
        return "flops"
    if "bytes" in words or "mem" in words:
        return "bytes"
    if len(words) > 1 and words[-1] == "s":
        return "seconds"
    return None


def human_value(unit: Unit, v: Any) -> str:
    """One table cell in ``unit`` (``—`` for a missing value).

    Args:
        unit: What :func:`column_unit` said.
        v: The cell's value.

    Returns:
        The formatted text.
    """
    if _missing(v):
        return "—"
    if unit == "bytes":
        return human_bytes(v)
    if unit == "flops":
        return human_count(v, "FLOP") if v else "0"
    return human_seconds(float(v))


def _missing(v: Any) -> bool:
    """None, NaN or pandas' NA (recognised by type name: pandas is not imported here)."""
    if v is None or type(v).__name__ == "NAType":
        return True
    try:
        return math.isnan(v)
    except TypeError:
        return False
