"""``explore(joint)``: an ipywidgets app around the navigable DAG view.

Layout: a control row (search box, collapse depth), the phase toggles, the DAG
(:class:`jointlab.widgets._dagcursor.DagWidget`: the same canvas renderer as
``jl.dag_view``, the stepper panel and the report, its title in its own bar), a
status line and the node table for the current selection. Clicking a node
selects it and its forward/backward twins (same ``seq_nr``, recorded as
``fwd_twin``); the table shows their rows. The selection is kept as graph node
names, so it survives a change of depth; grouped, the module groups holding a
selected node are outlined. Phase toggles leave the nodes of a phase out of the
drawing, with their edges and their share of every group's counts.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from jointlab import meta as _meta
from jointlab._deprecation import renamed_kwarg
from jointlab.errors import PlotArgumentError
from jointlab.viz.dagview import PHASE_COLORS
from jointlab.widgets._dagcursor import ALL, FIT, DagWidget

if TYPE_CHECKING:
    import pandas as pd

TABLE_ROWS = 50
PLACEHOLDER_PHASES = ("param", "buffer", "input")


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
        import pandas as pd

        return pd.DataFrame([by_name[n] for n in names], index=pd.Index(names, name="node"))
    return table.loc[[n for n in names if n in table.index]]


def opened_groups(payload: dict[str, Any], depth: int) -> set[int] | None:
    """Group ids the view opens at control value ``depth`` (None: every group).

    Args:
        payload: The view's payload (:func:`jointlab.viz.dagview.build_payload`).
        depth: :data:`ALL`, :data:`FIT` (as the payload's budget opens it) or a level ``k``
            (groups above level ``k`` open, those at ``k`` closed).

    Returns:
        The open group ids (the root always), or None when all are open.
    """
    if depth == ALL:
        return None
    if depth == FIT:
        return set(payload["expanded"]) | {0}
    return {g for g, lvl in enumerate(payload["groups"]["level"]) if lvl < depth} | {0}


def shown_items(payload: dict[str, Any], names: list[str], opened: set[int] | None) -> list[str]:
    """What the view draws for ``names``: a node's own name, or its closed group's name.

    A node is drawn inside the outermost group on its module path that is not open,
    as the renderer's ``update()`` does.

    Args:
        payload: The view's payload.
        names: Node names.
        opened: Open group ids (None: every group open).

    Returns:
        Distinct node or group names, in first-seen order.
    """
    nodes, groups = payload["nodes"], payload["groups"]
    pos = {n: i for i, n in enumerate(nodes["name"])}
    out: dict[str, None] = {}
    for name in names:
        path, g = [], nodes["g"][pos[name]]
        while g >= 0:
            path.append(g)
            g = groups["parent"][g]
        closed = [g for g in reversed(path) if opened is not None and g not in opened]
        out[groups["name"][closed[0]] if closed else name] = None
    return list(out)


class Explorer:
    """State and callbacks of the explore app (``.widget`` is what is displayed).

    The selection is kept as graph node names (:attr:`chosen`), so it survives
    a change of collapse depth; :attr:`selected` names what the view shows for
    it (nodes, or the module groups holding them).
    """

    def __init__(self, joint: Any, group_depth: int | None = None, height: int = 520) -> None:
        """Build the widgets for ``joint``; see :func:`explore`."""
        self.joint = joint
        self.nodes = list(joint.graph.nodes)
        self.infos = {n.name: _meta.info(n) for n in self.nodes}
        self.chosen: list[str] = []
        self.selected: list[str] = []
        self.search = W.Text(placeholder="search op or module, e.g. aten.mm or h.3.attn",
                             description="search", continuous_update=False,
                             layout=W.Layout(width="360px"))
        self.phases = {p: W.ToggleButton(**phase_look(True, p), value=True, description=p,
                                         layout=W.Layout(width="auto", min_width="90px"))
                       for p in PHASE_COLORS}
        depths = [("all nodes", ALL), ("fit budget", FIT),
                  *[(f"depth {k}", k) for k in range(1, 5)]]
        # every first state goes in at construction, inside the widget's opening message:
        # ipywidgets 7's front end drops updates that reach a model it is still creating
        self.view = DagWidget(joint, height=height, own_search=False,
                              css_class="jl-explore-dag", depth=group_depth)
        self.depth = W.Dropdown(options=depths, value=self.view.depth, description="collapse",
                                layout=W.Layout(width="200px"))
        self.status = W.HTML()
        # HTML, not an Output widget: ipywidgets 7's classic front end fails to build a
        # bare Output, and an HTML value renders the same in every front end
        self.table = W.HTML(layout=W.Layout(max_height="320px", overflow="auto"))
        self.search.observe(lambda _: self.on_search(), names="value")
        self.depth.observe(lambda _: self._on_depth(), names="value")
        for b in self.phases.values():
            b.observe(lambda _: self._on_phase(), names="value")
        self.view.observe(lambda ch: self.on_click(ch["new"].get("name")), names="click")
        self.widget = W.VBox([W.HBox([self.search, self.depth]),
                              W.HBox(list(self.phases.values())), self.view, self.status,
                              self.table])

    @property
    def depth_value(self) -> int | None:
        """The collapse depth control: None for every node, :data:`FIT` or a level ``k``."""
        return None if self.depth.value == ALL else self.depth.value

    # -- controls -------------------------------------------------------------------
    def _on_depth(self) -> None:
        self.view.depth = self.depth.value
        self._draw_selection()

    def _on_phase(self) -> None:
        for p, b in self.phases.items():
            b.set_state(phase_look(b.value, p))  # one message: the look follows the value
        self.view.hidden = [p for p, b in self.phases.items() if not b.value]

    # -- selection ------------------------------------------------------------------
    def on_click(self, name: str | None) -> None:
        """Select the node clicked in the view (and its twins)."""
        if name:
            self.select([name])

    def on_search(self) -> None:
        """Select every graph node whose op, module or name contains the search text.

        Works at every depth: grouped, the groups holding a match are outlined.
        """
        q = self.search.value.strip().lower()
        if not q:
            self.select([])
            return
        self.chosen = [n for n, m in self.infos.items() if matches(q, n, m)]
        self._draw_selection()
        self.view.focus += 1  # after ``selected``: the view moves to the hits it now holds

    def select(self, names: list[str], twins: bool = True) -> None:
        """Select the nodes ``names`` (and, with ``twins``, their twins) and show their rows.

        Args:
            names: Graph node names.
            twins: Also select forward/backward twins.
        """
        picked = [n for n in names if n in self.infos]
        if twins:
            want = set(picked) | {self.infos[n].get("fwd_twin") for n in picked}
            want |= {n for n, m in self.infos.items() if m.get("fwd_twin") in want}
            picked = [n for n in self.infos if n in want]
        self.chosen = picked
        self._draw_selection()

    def _draw_selection(self) -> None:
        """Highlight :attr:`chosen` in the view and list the chosen rows."""
        payload = self.view.payload
        self.selected = shown_items(payload, self.chosen, opened_groups(payload, self.depth.value))
        self.view.selected = list(self.chosen)
        names = self.chosen
        groups = [s for s in self.selected if s not in self.infos]
        where = f" in <b>{len(groups)}</b> group(s) at this depth" if groups else ""
        self.status.value = (f"<b>{len(names)}</b> node(s) selected{where}: "
                             + html.escape(", ".join(self.selected[:8]))
                             + (" …" if len(self.selected) > 8 else ""))
        if not names:
            self.table.value = ""
            return
        from jointlab.viz.frames import frame_html  # pandas: first needed by a selection

        self.table.value = frame_html(node_rows(self.joint, names[:TABLE_ROWS]))


def phase_look(shown: bool, phase: str) -> dict[str, str]:
    """A phase toggle's look: shown is coloured with a check mark, hidden is plain.

    Args:
        shown: Whether the phase's nodes are drawn.
        phase: The phase.

    Returns:
        ``button_style``, ``icon`` and ``tooltip`` for the ToggleButton.
    """
    if shown:
        return {"button_style": "info", "icon": "check",
                "tooltip": f"{phase} nodes shown: click to hide them"}
    return {"button_style": "", "icon": "", "tooltip": f"{phase} nodes hidden: click to show them"}


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
        depth: Initial module level drawn closed (None: every node when the graph fits
            the view's node budget, else as the budget opens it).
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
