"""``explore(joint)``: an ipywidgets app around the DAG figure.

Layout: a control row (search box, phase toggles, collapse depth), the
figure's title, the DAG as a plotly ``FigureWidget``, a status line and the
node table for the current selection. Clicking a node selects it and its forward/backward
twins (same ``seq_nr``, recorded as ``fwd_twin``); the table shows their rows.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W
import numpy as np
import pandas as pd
import plotly.graph_objects as go

from jointlab import meta as _meta
from jointlab._deprecation import renamed_kwarg
from jointlab.errors import PlotArgumentError
from jointlab.viz import dag
from jointlab.viz._layout import route_edges

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


ALL = -1  # the collapse dropdown's value for "all nodes" (None would show blank)
PLACEHOLDER_PHASES = ("param", "buffer", "input")


class Explorer:
    """State and callbacks of the explore app (``.widget`` is what is displayed).

    The selection is kept as graph node names (:attr:`chosen`), so it survives
    a change of collapse depth; :attr:`selected` names what the figure shows
    for it (nodes, or the module groups holding them).
    """

    def __init__(self, joint: Any, group_depth: int | None = None, height: int = 520) -> None:
        """Build the widgets for ``joint``; see :func:`explore`."""
        self.joint = joint
        self.height = height
        self.full = dag.graph_data(joint)
        self.chosen: list[str] = []
        self.selected: list[str] = []
        self.search = W.Text(placeholder="search op or module, e.g. aten.mm or h.3.attn",
                             description="search", continuous_update=False,
                             layout=W.Layout(width="360px"))
        self.phases = {p: W.ToggleButton(value=True, description=p, tooltip=f"show {p} nodes",
                                         layout=W.Layout(width="90px")) for p in dag.PHASE_COLORS}
        depths = [("all nodes", ALL), *[(f"depth {k}", k) for k in range(1, 5)]]
        self.depth = W.Dropdown(options=depths, value=ALL if group_depth is None else group_depth,
                                description="collapse", layout=W.Layout(width="200px"))
        self.title = W.HTML()
        self.status = W.HTML()
        self.table = W.Output(layout=W.Layout(max_height="320px", overflow="auto"))
        self.fig = go.FigureWidget()
        self._rebuild()
        self.search.observe(lambda _: self.on_search(), names="value")
        self.depth.observe(lambda _: self._rebuild(), names="value")
        for b in self.phases.values():
            b.observe(lambda _: self._on_phase(), names="value")
        controls = W.HBox([self.search, self.depth])
        self.widget = W.VBox([controls, W.HBox(list(self.phases.values())), self.title,
                              self.fig, self.status, self.table])

    @property
    def depth_value(self) -> int | None:
        """The collapse depth, None for all nodes."""
        return None if self.depth.value == ALL else self.depth.value

    def _shown_placeholders(self) -> tuple[str, ...]:
        return tuple(p for p in PLACEHOLDER_PHASES if self.phases[p].value)

    # -- figure ---------------------------------------------------------------------
    def _rebuild(self) -> None:
        depth = self.depth_value
        # Grouped, parameters/inputs/buffers sit inside module groups: hiding them
        # means grouping without them, so the figure is rebuilt from the kept nodes.
        self._built_with = self._shown_placeholders() if depth is not None else PLACEHOLDER_PHASES
        phases = None if depth is None else {*self.phases} - {
            p for p in PLACEHOLDER_PHASES if p not in self._built_with}
        src = dag.plot_dag(self.joint, depth=depth, height=self.height, phases=phases)
        self.data: dag.DagData = src._jointlab_data
        self.title.value = f"<b>{src.layout.title.text or ''}</b>"
        with self.fig.batch_update():
            self.fig.data = ()
            self.fig.add_traces(list(src.data))
            self.fig.layout = src.layout
            self.fig.layout.title = None  # shown above the figure, clear of the modebar
            self.fig.layout.margin.t = 30
        for tr in self.fig.data:
            if tr.customdata is not None:
                tr.on_click(self.on_click)
        self._positions()
        self._edge_sets = self._edges_by_trace()
        self._hidden: tuple[int, ...] = ()  # as plot_dag drew it: every edge
        self._apply_phases()
        self._draw_selection()

    def _node_traces(self) -> list[Any]:
        return [t for t in self.fig.data if t.customdata is not None]

    def _positions(self) -> None:
        where = {}
        for tr in self._node_traces():
            for k, name in enumerate(tr.customdata):
                where[name] = (tr.x[k], tr.y[k])
        xy = np.asarray([where[n] for n in self.data.names], dtype=float).reshape(-1, 2)
        self._x, self._y = xy[:, 0], xy[:, 1]

    def _edges_by_trace(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        d = self.data
        to_out = np.asarray([m.get("phase") == "output" for m in d.info], dtype=bool)[d.dst]
        edges = {"edges": (d.src[~to_out], d.dst[~to_out]),
                 "→ output": (d.src[to_out], d.dst[to_out])}
        if not d.members and any(t.name == "saved activations" for t in self.fig.data):
            rel = dag.relation_edges(self.joint, d)
            edges.update({"saved activations": rel["saved"], "param → grad": rel["grads"]})
        return edges

    def _on_phase(self) -> None:
        if self.depth_value is not None and self._shown_placeholders() != self._built_with:
            self._rebuild()
        else:
            self._apply_phases()

    def _apply_phases(self) -> None:
        """Hide the nodes of toggled-off phases and every edge that touches one.

        Each trace gets its own update: a FigureWidget batch that sets different
        properties on different traces resets the unset ones in the browser.
        """
        shown = np.asarray([self.phases[m.get("phase")].value if m.get("phase") in self.phases
                            else True for m in self.data.info], dtype=bool)
        with self.fig.batch_update():
            for tr in self._node_traces():
                if tr.name in self.phases:
                    tr.visible = self.phases[tr.name].value
        key = tuple(np.flatnonzero(~shown))
        if key == self._hidden:
            return
        self._hidden = key
        for tr in self.fig.data:
            if tr.name in self._edge_sets:
                s, t = self._edge_sets[tr.name]
                keep = shown[s] & shown[t]
                xs, ys = route_edges(self._x, self._y, s[keep], t[keep])
                with self.fig.batch_update():
                    tr.x, tr.y = plain_floats(xs), plain_floats(ys)

    # -- selection ------------------------------------------------------------------
    def on_click(self, trace: Any, points: Any, state: Any = None) -> None:
        """Select the clicked node (plotly click callback)."""
        if not points.point_inds:
            return
        self.select([str(trace.customdata[points.point_inds[0]])])

    def on_search(self) -> None:
        """Select every graph node whose op, module or name contains the search text.

        Works at every depth: grouped, the groups holding a match are ringed.
        """
        q = self.search.value.strip().lower()
        if not q:
            self.select([])
            return
        self.chosen = [n for n, m in zip(self.full.names, self.full.info) if matches(q, n, m)]
        self._draw_selection()

    def select(self, names: list[str], twins: bool = True) -> None:
        """Select ``names`` (and, with ``twins``, their twins) and show their rows.

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
        picked = [d.names[i] for i in idx]
        self.chosen = [m for i in idx for m in d.members[i]] if d.members else picked
        self._draw_selection()

    def _draw_selection(self) -> None:
        """Ring what the figure shows of :attr:`chosen` and list the chosen rows."""
        d = self.data
        if d.members:
            chosen = set(self.chosen)
            idx = [i for i, mem in enumerate(d.members) if chosen.intersection(mem)]
        else:
            pos = {n: i for i, n in enumerate(d.names)}
            idx = [pos[n] for n in self.chosen if n in pos]
        self.selected = [d.names[i] for i in idx]
        ring = self.fig.data[-1]
        with self.fig.batch_update():
            ring.x, ring.y = plain_floats(self._x[idx]), plain_floats(self._y[idx])
            ring.showlegend = bool(idx)
        self._show_rows()

    def _show_rows(self) -> None:
        names = self.chosen
        where = (f" in <b>{len(self.selected)}</b> group(s)" if self.data.members
                 else "")
        self.status.value = (f"<b>{len(names)}</b> node(s) selected{where}: "
                             + html.escape(", ".join(self.selected[:8]))
                             + (" …" if len(self.selected) > 8 else ""))
        self.table.outputs = ()
        if names:
            self.table.append_display_data(node_rows(self.joint, names[:TABLE_ROWS]))


def plain_floats(a: np.ndarray) -> list[float | None]:
    """A float array as a list with None for NaN (gaps), which FigureWidget updates sync.

    Args:
        a: The array.

    Returns:
        The list.
    """
    return [None if v != v else v for v in np.asarray(a, dtype=float).tolist()]


def matches(q: str, name: str, m: dict[str, Any]) -> bool:
    """True when the lower-case query ``q`` is in a node's op, module or name.

    Args:
        q: The query, lower case (``mm``, ``aten.mm``, ``h.3.attn``).
        name: The node name.
        m: The node's jointlab meta.

    Returns:
        Whether the node matches.
    """
    target = str(m.get("target", "")).lower()
    return q in target or q in str(m.get("module", "")).lower() or q in name.lower()


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
