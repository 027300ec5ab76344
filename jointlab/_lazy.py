"""Module-level ``__getattr__`` that imports public names on first use.

Keeps ``import jointlab`` light: names that need plotly or ipywidgets are
imported only when first read, then cached in the package's namespace.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_getattr(package: str, namespace: dict[str, Any], names: dict[str, str]
                 ) -> Callable[[str], Any]:
    """Build a ``__getattr__`` for ``package`` that resolves ``names`` lazily.

    Args:
        package: The package's name, for the error message.
        namespace: The package's ``globals()``; resolved names are cached there.
        names: Public name to the module that defines it.

    Returns:
        The function to assign to the package's ``__getattr__``.
    """

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            namespace[name] = value  # later lookups skip __getattr__
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
