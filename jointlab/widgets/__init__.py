"""ipywidgets apps over a JointGraph: the explorer and the stepper panel.

Submodules are imported on first use.
"""

from __future__ import annotations

from jointlab._lazy import lazy_getattr

_LAZY = {
    "explore": "jointlab.widgets._explore",
    "stepper_widget": "jointlab.widgets._stepper",
}

__all__ = list(_LAZY)


__getattr__ = lazy_getattr(__name__, globals(), _LAZY)
