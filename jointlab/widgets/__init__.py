"""ipywidgets apps over a JointGraph: the explorer and the stepper panel.

Submodules are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "explore": "jointlab.widgets._explore",
    "stepper_widget": "jointlab.widgets._stepper",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    """Import the widget apps on first access."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip __getattr__
        return value
    raise AttributeError(f"module 'jointlab.widgets' has no attribute {name!r}")
