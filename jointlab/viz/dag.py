"""``plot_dag``: a deprecated alias of :func:`jointlab.dag_view` (one DAG engine).

``plot_dag`` was a plotly figure with its own layout and palette, unlabelled
dots. It now returns the labelled, navigable ``dag_view`` of the same graph,
with a :class:`DeprecationWarning` at the caller. Its arguments are mapped
where the view has the same meaning (``color_by``, ``depth``, ``height``,
``title``); the ones the view cannot honour (``highlight`` while
``dag_view`` has no initial search, ``relations=True``, ``sweeps``,
``phases``) are refused with :class:`jointlab.errors.PlotArgumentError`,
never dropped. Nothing here imports plotly.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from jointlab._deprecation import renamed_kwarg, warn_renamed
from jointlab.errors import PlotArgumentError

__all__ = ["plot_dag"]

COLOR_BY = ("phase", "module", "category", "bytes")


def _check_depth(depth: Any) -> None:
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)
                              or depth < 0):
        raise PlotArgumentError(f"depth must be an int >= 0 or None, got {depth!r}")


def _refuse_unmapped(relations: Any, sweeps: Any, phases: Any) -> None:
    """Refuse what ``dag_view`` cannot draw, saying what to do instead."""
    if relations:
        raise PlotArgumentError(
            "plot_dag(relations=True) is gone: plot_dag is now dag_view, which draws no "
            "saved-activation or parameter->gradient overlays; click a node for its saved "
            "tensors and gradient in the detail panel, or leave relations out")
    if sweeps is not None:
        raise PlotArgumentError(
            "plot_dag(sweeps=...) is gone: dag_view lays out with the one shared layout "
            "(jointlab.viz._layout, fixed sweeps); leave sweeps out")
    if phases is not None:
        raise PlotArgumentError(
            "plot_dag(phases=...) cannot be mapped: dag_view always draws both bands; "
            "select the nodes you want with joint.nodes / jl.select instead")


def depth_budget(joint: Any, depth: int | None) -> int:
    """The ``dag_view`` budget that opens the module tree down to ``depth`` levels.

    ``dag_view`` opens whole levels while the drawn items fit its budget, so the
    budget of exactly the items drawn with levels ``< depth`` open opens those.
    Levels count where the module tree branches (``jointlab.viz._hierarchy``).

    Args:
        joint: The traced graph.
        depth: Levels to open; ``None`` opens everything (one item per node).

    Returns:
        The budget.
    """
    from jointlab import meta as _meta
    from jointlab.viz import _hierarchy

    nodes = list(joint.graph.nodes)
    if depth is None:
        return max(len(nodes), 1)
    infos = [_meta.info(n) for n in nodes]
    tree = _hierarchy.module_tree([m.get("module", "") for m in infos])
    is_bwd = np.asarray([m.get("phase") in ("backward", "output") for m in infos], dtype=bool)
    return max(_hierarchy.visible_count(tree, is_bwd, tree.level < depth), 1)


def plot_dag(joint: Any, *, color_by: str = "phase", depth: int | None = None,
             highlight: str | list[str] | None = None, relations: bool | None = None,
             sweeps: int | None = None, height: int = 560, title: str | None = None,
             group_depth: int | None = None, phases: Any = None) -> Any:
    """Deprecated: the joint graph's :func:`jointlab.dag_view` (labelled, navigable).

    Args:
        joint: A :class:`jointlab.JointGraph`.
        color_by: ``"phase"``, ``"module"``, ``"category"`` or ``"bytes"`` (as in the view).
        depth: Module levels opened at first; ``None`` opens every node.
        highlight: Node name(s) to find: passed to the view's search when ``dag_view``
            takes one, refused otherwise (type the name in the view's search box).
        relations: Refused when true (the view draws no relation overlays).
        sweeps: Refused (the one layout has fixed sweeps).
        height: Height in pixels.
        title: The view's title line.
        group_depth: Deprecated spelling of ``depth``.
        phases: Refused (the view draws both bands).

    Returns:
        A :class:`jointlab.viz.dagview.DagView` (displays as HTML, also in Colab).

    Raises:
        PlotArgumentError: Unknown ``color_by``, a bad ``depth``, or an argument the
            view cannot honour.
    """
    warn_renamed("jl.plot_dag(...)", "jl.dag_view(...), the same graph labelled and "
                 "navigable (jl.export_figure for a static SVG/PNG)")
    depth = renamed_kwarg("plot_dag", "depth", depth, "group_depth", group_depth,
                          PlotArgumentError)
    if color_by not in COLOR_BY:
        raise PlotArgumentError(f"color_by must be one of {COLOR_BY}, got {color_by!r}")
    _check_depth(depth)
    _refuse_unmapped(relations, sweeps, phases)
    from jointlab.viz.dagview import dag_view

    kw: dict[str, Any] = {}
    if highlight is not None:
        if "search" not in inspect.signature(dag_view).parameters or \
                not isinstance(highlight, str):
            raise PlotArgumentError(
                "plot_dag(highlight=...) cannot be mapped: dag_view takes no initial search "
                "of these names; call jl.dag_view(joint) and type the name in its search box")
        kw["search"] = highlight
    view = dag_view(joint, budget=depth_budget(joint, depth), color_by=color_by,
                    height=height, **kw)
    if title is not None:
        view.payload["title"] = str(title)
    return view
