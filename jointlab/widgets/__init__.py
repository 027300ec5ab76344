"""ipywidgets apps over a JointGraph: the explorer and the stepper panel.

Submodules are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "explore": "jointlab.widgets.explore",
    "stepper_widget": "jointlab.widgets.stepper",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    """Import the widget apps on first access."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jointlab.widgets' has no attribute {name!r}")
