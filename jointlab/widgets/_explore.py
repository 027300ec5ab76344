"""``explore(joint)``: an ipywidgets app around the DAG figure.

Layout: a control row (search box, phase toggles, collapse depth), the DAG
as a plotly ``FigureWidget``, a status line and the node table for the
current selection. Clicking a node selects it and its forward/backward
twins (same ``seq_nr``, recorded as ``fwd_twin``); the table shows their rows.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W
import pandas as pd
import plotly.graph_objects as go

from jointlab import meta as _meta
from jointlab._deprecation import renamed_kwarg
from jointlab.errors import PlotArgumentError
from jointlab.viz import dag

TABLE_ROWS = 50


def node_rows(joint: Any, names: list[str]) -> pd.DataFrame:
    """Rows of ``joint.nodes`` for ``names`` (meta read directly if the table is unavailable).

    Args:
        joint: The JointGraph.
        names: Node names.

    Returns:
        One row per name, in the given order.
    """
    try:
        table = joint.nodes
    except ImportError:  # jointlab.analysis.tables not present in this checkout
        by_name = {n.name: _meta.info(n) for n in joint.graph.nodes}
        return pd.DataFrame([by_name[n] for n in names], index=pd.Index(names, name="node"))
    return table.loc[[n for n in names if n in table.index]]


class Explorer:
    """State and callbacks of the explore app (``.widget`` is what is displayed)."""

    def __init__(self, joint: Any, group_depth: int | None = None, height: int = 520) -> None:
        """Build the widgets for ``joint``; see :func:`explore`."""
        self.joint = joint
        self.height = height
        self.selected: list[str] = []
        self.search = W.Text(placeholder="search op or module, e.g. aten.mm or h.3.attn",
                             description="search", continuous_update=False,
                             layout=W.Layout(width="360px"))
        self.phases = {p: W.ToggleButton(value=True, description=p, tooltip=f"show {p} nodes",
                                         layout=W.Layout(width="90px")) for p in dag.PHASE_COLORS}
        depths = [("all nodes", None), *[(f"depth {k}", k) for k in range(1, 5)]]
        self.depth = W.Dropdown(options=depths,
                                value=group_depth, description="collapse",
                                layout=W.Layout(width="200px"))
        self.status = W.HTML()
        self.table = W.Output(layout=W.Layout(max_height="320px", overflow="auto"))
        self.fig = go.FigureWidget()
        self._rebuild()
        self.search.observe(lambda _: self.on_search(), names="value")
        self.depth.observe(lambda _: self._rebuild(), names="value")
        for b in self.phases.values():
            b.observe(lambda _: self._apply_phases(), names="value")
        controls = W.HBox([self.search, self.depth])
        self.widget = W.VBox([controls, W.HBox(list(self.phases.values())), self.fig,
                              self.status, self.table])

    # -- figure ---------------------------------------------------------------------
    def _rebuild(self) -> None:
        src = dag.plot_dag(self.joint, depth=self.depth.value, height=self.height)
        self.data: dag.DagData = src._jointlab_data
        with self.fig.batch_update():
            self.fig.data = ()
            self.fig.add_traces(list(src.data))
            self.fig.layout = src.layout
        for tr in self.fig.data:
            if tr.customdata is not None:
                tr.on_click(self.on_click)
        self._apply_phases()
        self.select([])

    def _node_traces(self) -> list[Any]:
        return [t for t in self.fig.data if t.customdata is not None]

    def _apply_phases(self) -> None:
        with self.fig.batch_update():
            for tr in self._node_traces():
                if tr.name in self.phases:
                    tr.visible = self.phases[tr.name].value

    # -- selection ------------------------------------------------------------------
    def on_click(self, trace: Any, points: Any, state: Any = None) -> None:
        """Select the clicked node (plotly click callback)."""
        if not points.point_inds:
            return
        self.select([str(trace.customdata[points.point_inds[0]])])

    def on_search(self) -> None:
        """Select every node whose op or module contains the search text."""
        q = self.search.value.strip().lower()
        if not q:
            self.select([])
            return
        hits = [n for n, m in zip(self.data.names, self.data.info)
                if q in str(m.get("target", "")).lower() or q in str(m.get("module", "")).lower()]
        self.select(hits, twins=False)

    def select(self, names: list[str], twins: bool = True) -> None:
        """Highlight ``names`` (and, with ``twins``, their twins) and show their rows.

        Args:
            names: Node names in the current figure (group names when collapsed).
            twins: Also select forward/backward twins.
        """
        d = self.data
        if twins:
            idx = dag.highlight_indices(d, names)
        else:
            pos = {n: i for i, n in enumerate(d.names)}
            idx = [pos[n] for n in names if n in pos]
        self.selected = [d.names[i] for i in idx]
        ring = self.fig.data[-1]
        xs, ys = [], []
        for tr in self._node_traces():
            where = {n: k for k, n in enumerate(tr.customdata)}
            for name in self.selected:
                if name in where:
                    xs.append(tr.x[where[name]])
                    ys.append(tr.y[where[name]])
        with self.fig.batch_update():
            ring.x, ring.y = xs, ys
            ring.showlegend = bool(xs)
        self._show_rows()

    def _graph_names(self) -> list[str]:
        if not self.data.members:
            return self.selected
        pos = {n: i for i, n in enumerate(self.data.names)}
        return [m for g in self.selected for m in self.data.members[pos[g]]]

    def _show_rows(self) -> None:
        names = self._graph_names()
        self.status.value = (f"<b>{len(names)}</b> node(s) selected: "
                             + html.escape(", ".join(self.selected[:8]))
                             + (" …" if len(self.selected) > 8 else ""))
        self.table.outputs = ()
        if names:
            self.table.append_display_data(node_rows(self.joint, names[:TABLE_ROWS]))


def explore(joint: Any, *, depth: int | None = None, height: int = 520,
            group_depth: int | None = None) -> W.VBox:
    """Open an interactive explorer of a joint graph.

    Args:
        joint: A :class:`jointlab.JointGraph`.
        depth: Initial module-collapse depth (None shows every node).
        height: Height of the DAG in pixels.
        group_depth: Deprecated spelling of ``depth``.

    Returns:
        The app's root widget; its ``explorer`` attribute holds the state and callbacks.

    Raises:
        PlotArgumentError: Both ``depth`` and ``group_depth`` were given.
    """
    depth = renamed_kwarg("explore", "depth", depth, "group_depth", group_depth,
                          PlotArgumentError)
    app = Explorer(joint, group_depth=depth, height=height)
    app.widget.explorer = app
    return app.widget
