"""jointlab: see and debug PyTorch's joint forward+backward graph.

This module only re-exports the public API. Names that need plotly or
ipywidgets (``plot_dag``, ``plot_memory``, ``explore``, ``report``) are
resolved on first use, so ``import jointlab`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import errors as errors
from ._graph import JointGraph as JointGraph
from ._trace import trace as trace

_LAZY = {
    "Stepper": "jointlab._step",
    "compare": "jointlab._step",
    "Comparison": "jointlab._compare",
    "MemoryProfile": "jointlab._memory",
    "load": "jointlab._persist",
    "plot_dag": "jointlab.viz",
    "plot_memory": "jointlab.viz",
    "plot_lifetimes": "jointlab.viz",
    "explore": "jointlab.widgets",
    "report": "jointlab._report",
}

__all__ = ["JointGraph", "errors", "trace", *_LAZY]


def __getattr__(name: str) -> Any:
    """Import optional parts of the API on first access."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip __getattr__
        return value
    raise AttributeError(f"module 'jointlab' has no attribute {name!r}")
