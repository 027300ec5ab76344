"""Plotly figures of a JointGraph: the DAG, memory over time, tensor lifetimes.

Everything here reads the graph's annotations and tables and writes nothing
back. Submodules are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "plot_dag": "jointlab.viz.dag",
    "plot_memory": "jointlab.viz.memory",
    "plot_lifetimes": "jointlab.viz.memory",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    """Import the figure functions on first access."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip __getattr__
        return value
    raise AttributeError(f"module 'jointlab.viz' has no attribute {name!r}")
