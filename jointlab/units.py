"""Human-readable counts and byte sizes for cards, hovers, tables and errors."""

from __future__ import annotations


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
