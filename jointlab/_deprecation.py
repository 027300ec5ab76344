"""Deprecated spellings kept for one release (see README "Naming").

Each old spelling still works and emits a :class:`DeprecationWarning` that
names the new one, pointing at the caller's line.
"""

from __future__ import annotations

import warnings
from typing import Any

#: The release after which the old spellings are removed.
REMOVED_IN = "0.3"


def warn_renamed(old: str, new: str, stacklevel: int = 2) -> None:
    """Warn that ``old`` is a deprecated spelling of ``new``.

    Args:
        old: The old spelling, e.g. ``"plot_dag(group_depth=...)"``.
        new: The spelling to use instead.
        stacklevel: As for ``warnings.warn``, counted from the caller of this
            function (2: the line that called the caller).
    """
    warnings.warn(f"{old} is deprecated and will be removed in jointlab {REMOVED_IN}; "
                  f"use {new}.", DeprecationWarning, stacklevel=stacklevel + 1)


def renamed_kwarg(func: str, new: str, value: Any, old: str, old_value: Any,
                  error: type[Exception]) -> Any:
    """The value of keyword ``new``, taking the deprecated keyword ``old`` if given.

    Args:
        func: The public function's name, for the messages.
        new: The keyword's name now.
        value: What the caller passed for ``new`` (None when not given).
        old: The deprecated keyword's name.
        old_value: What the caller passed for ``old`` (None when not given).
        error: The jointlab error class raised when both are given.

    Returns:
        ``value``, or ``old_value`` (with a DeprecationWarning) when only that was given.

    Raises:
        error: Both keywords were given.
    """
    if old_value is None:
        return value
    if value is not None:
        raise error(f"{func}() got both {new}= and its deprecated spelling {old}=; "
                    f"pass only {new}=.")
    warn_renamed(f"{func}({old}=...)", f"{func}({new}=...)", stacklevel=3)
    return old_value
