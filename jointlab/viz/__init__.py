"""Views of a JointGraph: the DAG (dag_view; plot_dag is its alias), static export, memory.

Everything here reads the graph's annotations and tables and writes nothing
back. Submodules are imported on first use.
"""

from __future__ import annotations

from jointlab._lazy import lazy_getattr

_LAZY = {
    "plot_dag": "jointlab.viz.dag",
    "dag_view": "jointlab.viz.dagview",
    "plot_memory": "jointlab.viz.memory",
    "plot_lifetimes": "jointlab.viz.memory",
    "plot_diff": "jointlab.viz.diff",
    "diff_view": "jointlab.viz.diff",
    "export_figure": "jointlab.viz.export",
}

__all__ = list(_LAZY)


__getattr__ = lazy_getattr(__name__, globals(), _LAZY)
