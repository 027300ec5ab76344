"""``DagWidget``: the bundled canvas DAG renderer in an anywidget (explore, stepper panel).

The panel used to show the DAG as a plotly ``FigureWidget`` of WebGL
(``scattergl``) traces. Two things went wrong with that in JupyterLab:

- Each ``FigureWidget`` ships plotly's whole 5 MB widget bundle as its own
  anywidget module, which the browser imports again for every panel
  (7-16 s per panel on the shared test machine).
- Every plotly WebGL plot holds WebGL contexts, and Chromium keeps only a
  few per page: with several panels and DAG plots open it logs "Too many
  active WebGL contexts. Oldest context will be lost", and a plot whose
  context is lost keeps its SVG axes but loses its points (the empty axis
  grid seen in 1 of 3 runs of notebook 03, depending on what rendered when).

This widget draws with the bundled 2-D canvas renderer (no WebGL, no
plotly). It carries the compact :func:`jointlab.viz.dagview.build_payload`
and its view state as synced traits, and its small module
(:func:`jointlab.viz.dagview.renderer_js` plus the glue below) draws from that
state whenever a view is mounted, once the element is in the document (the
renderer sizes its canvas from it), and again after every change. Nothing
depends on the order in which messages arrive.

Traits, Python to browser: ``current`` (ringed node, the stepper's cursor),
``selected`` (highlighted nodes; a closed group holding one is outlined),
``hidden`` (phases whose nodes, edges and box counts are left out),
``depth`` (module level shown closed; -1 every node, -2 the budget's fit) and
``values`` (per node, value statistics rows for the detail panel) and ``focus``
(a counter: each change brings the ``selected`` nodes into view, explore's
search). Browser to
Python: ``click`` (the node last clicked on the canvas, with a counter).
"""

from __future__ import annotations

from typing import Any

import anywidget
import traitlets

from jointlab.viz.dagview import DEFAULT_BUDGET, build_payload, renderer_js

__all__ = ["ALL", "FIT", "DagCursor", "DagWidget"]

ALL = -1  # depth: every node open
FIT = -2  # depth: as the payload's node budget opens it

_GLUE = r"""
function hiddenUpdate(view) {  // update() that leaves out the nodes of hidden phases
  const P = view.P, N = view.N, T = P.tables, orig = view.update.bind(view);
  const G = P.groups, base = {};
  for (const k of ["count", "flops", "bytes"]) {
    for (const s of ["_f", "_b"]) base[k + s] = G[k + s].slice();
  }
  view.hiddenPhases = new Set();
  view.isHidden = i => view.hiddenPhases.has(T.phase[P.nodes.ph[i]]);
  view.update = function () {
    orig();  // items, boxes and edges of every node; it draws on the next frame
    const hide = this.isHidden;
    for (const k in base) G[k] = base[k].slice();
    if (!this.hiddenPhases.size) return;
    for (const k in base) G[k].fill(0);  // box counts, FLOPs and bytes of what is shown
    for (let i = 0; i < N; i++) {
      if (hide(i)) continue;
      const s = this.band[i] ? "_b" : "_f";
      for (let g = this.g[i]; g >= 0; g = this.parent[g]) {
        G["count" + s][g] += 1;
        G["flops" + s][g] += P.nodes.flops[i];
        G["bytes" + s][g] += P.nodes.bytes[i];
      }
    }
    this.visNodes = this.visNodes.filter(i => !hide(i));
    const boxes = new Set();
    for (let i = 0; i < N; i++) if (!hide(i) && this.itemOf[i] >= N) boxes.add(this.itemOf[i] - N);
    this.visBoxes = [...boxes];
    const E = P.edges, seen = new Set(), es = [];
    for (let k = 0; k < E.length; k += 2) {
      if (hide(E[k]) || hide(E[k + 1])) continue;
      const a = this.itemOf[E[k]], b = this.itemOf[E[k + 1]], key = a + "," + b;
      if (a === b || seen.has(key)) continue;
      seen.add(key); es.push(a, b);
    }
    this.visEdges = es;
    this._moduleColors(); this._legend(); this.draw();
  };
}

function setDepth(view, depth) {
  const P = view.P;
  if (depth === -2) {
    view.expanded.fill(0);
    for (const g of P.expanded) view.expanded[g] = 1;
  } else {
    for (let g = 0; g < view.G; g++) view.expanded[g] = depth < 0 || view.level[g] < depth ? 1 : 0;
  }
  view.expanded[0] = 1;
}

function ring(view, model) {  // the stepper's current node: ringed, its twins too, both in view
  const cur = model.get("current"), i = cur ? view.index.get(cur) ?? -1 : -1;
  view.selected = i;
  if (i >= 0) view.follow(i);
}

function highlight(view, model) {
  const pos = view.index, hits = new Set();
  for (const name of model.get("selected")) {
    const i = pos.get(name);
    if (i !== undefined && !view.isHidden(i)) hits.add(i);
  }
  view.hits = hits;
}

const READ = 20;  // px per layer row: the renderer's readable zoom (its search goes there)

// explore's search: every hit in view when they fit at a readable zoom, else the first one
function showHits(view, names) {
  const W = view.canvas.clientWidth, H = view.canvas.clientHeight, its = [];
  for (const name of names) {
    const i = view.index.get(name);
    if (i === undefined || view.isHidden(i)) continue;
    its.push(view.itemOf[i] >= 0 ? view.itemOf[i] : i);
  }
  if (!its.length || !W || !H) return;
  const M = 60, k = Math.max(READ, Math.min(view.k, 4 * READ));
  let [x0, y0] = view.itemXY(its[0]), x1 = x0, y1 = y0;
  for (const it of its) {
    const [x, y] = view.itemXY(it);
    x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
  }
  if ((x1 - x0) * k > W - 2 * M || (y1 - y0) * k > H - 2 * M) {  // too spread: the first
    [x0, y0] = view.itemXY(its[0]); [x1, y1] = [x0, y0];
  }
  view.k = k; view.ay = 1;
  view.vx = (x0 + x1) / 2 - W / 2 / k; view.vy = (y0 + y1) / 2 + H / 2 / k;
  view.viewChanged();
}

function valueRows(view, model) {  // detail-panel rows: the value statistics Python sent
  view.detailRows = i => Object.entries(model.get("values")[view.P.nodes.name[i]] || {});
}

function wire(view, model, el) {
  view.index = new Map(view.P.nodes.name.map((n, i) => [n, i]));
  hiddenUpdate(view); valueRows(view, model);
  if (!model.get("own_search")) view.searchBox.style.display = "none";
  const select = view.select.bind(view);
  let clicks = 0;
  view.detailNode = -1;
  view.select = function (i, centre) {  // a node clicked or followed: tell Python
    select(i, centre);
    this.detailNode = i;
    model.set("click", {name: this.P.nodes.name[i], n: ++clicks}); model.save_changes();
  };
  const refresh = what => {
    if (what.has("hidden")) view.hiddenPhases = new Set(model.get("hidden"));
    if (what.has("depth")) setDepth(view, model.get("depth"));
    view.update();
    if (what.has("depth")) view.fit(true);  // readable: the left part of a long graph
    if (what.has("current") || what.has("depth")) ring(view, model);  // the cursor in view
    highlight(view, model);
    if (what.has("focus")) showHits(view, model.get("selected"));  // a search: go to its hits
    const open = view.detailNode >= 0 && view.detail.style.display === "block";
    if (what.has("values") && open) {  // the open panel shows the new stats; the ring stays
      const ringed = view.selected;
      select(view.detailNode); view.selected = ringed;
    }
    view.draw();
    el.dataset.version = String(Number(el.dataset.version || 0) + 1);
  };
  const first = ["hidden", "current", "selected"];
  if (model.get("depth") !== -2) first.push("depth");  // -2: as the payload opened it
  refresh(new Set(first));
  return refresh;
}

export default {
  render({ model, el }) {
    const id = "jl-dag-" + Math.random().toString(36).slice(2, 10);
    const root = document.createElement("div");
    root.className = "jl-dag " + model.get("css_class"); root.id = id;
    root.style.height = model.get("height") + "px";
    const data = document.createElement("script");
    data.type = "application/json"; data.id = id + "-data";
    data.textContent = JSON.stringify(model.get("payload"));
    el.appendChild(root); el.appendChild(data);
    let refresh = null, gone = false, view = null;
    const handlers = ["current", "selected", "hidden", "depth", "values", "focus"].map(k => {
      const f = () => { if (refresh) refresh(new Set([k])); };
      model.on("change:" + k, f);
      return [k, f];
    });
    const mount = () => {  // ipywidgets may render before the element is in the document
      if (gone) return;
      if (!root.isConnected) { requestAnimationFrame(mount); return; }
      view = window.jointlabDag(id);
      refresh = wire(view, model, root);
      root.dataset.ready = "1";
    };
    mount();
    return () => {
      gone = true; for (const [k, f] of handlers) model.off("change:" + k, f);
      if (view) view.release();
    };
  },
};
"""


def _esm() -> str:
    return renderer_js() + "\n" + _GLUE


class DagWidget(anywidget.AnyWidget):
    """The joint graph's navigable DAG as a widget, its view state synced with Python.

    Attributes:
        payload: What the renderer draws (:func:`jointlab.viz.dagview.build_payload`).
        current: Name of the ringed node (the stepper's cursor); ``""`` rings nothing.
        selected: Names of highlighted nodes.
        hidden: Phases left out of the drawing (nodes, their edges, box counts).
        depth: Module level drawn closed: :data:`ALL`, :data:`FIT` or ``k >= 1``.
        values: Per node name, ``{row: text}`` value statistics for the detail panel.
        click: ``{"name": node, "n": count}`` of the last node clicked in the browser.
        focus: Bumped to bring :attr:`selected` into view (all of it when it fits at a
            readable zoom, else its first node).
        own_search: Show the renderer's own search box.
        height: Canvas height in pixels.
    """

    _esm = traitlets.Unicode(_esm()).tag(sync=True)
    payload = traitlets.Dict().tag(sync=True)
    current = traitlets.Unicode("").tag(sync=True)
    selected = traitlets.List(traitlets.Unicode()).tag(sync=True)
    hidden = traitlets.List(traitlets.Unicode()).tag(sync=True)
    depth = traitlets.Int(FIT).tag(sync=True)
    values = traitlets.Dict().tag(sync=True)
    click = traitlets.Dict().tag(sync=True)
    focus = traitlets.Int(0).tag(sync=True)
    own_search = traitlets.Bool(True).tag(sync=True)
    css_class = traitlets.Unicode("jl-dag-widget").tag(sync=True)
    height = traitlets.Int(520).tag(sync=True)

    def __init__(self, joint: Any, height: int = 520, title: str | None = None,
                 depth: int | None = None, **kwargs: Any) -> None:
        """Build the payload of ``joint`` once; later changes only move traits.

        Args:
            joint: A traced joint graph.
            height: Canvas height in pixels.
            title: Prefix of the view's title (``"<title> · Joint graph: ..."``).
            depth: The first collapse depth; None: :data:`ALL` when every node fits the
                payload's node budget, else :data:`FIT`.
            **kwargs: More traits (``own_search``, ``current``, ...).
        """
        payload = build_payload(joint, budget=DEFAULT_BUDGET)
        if title:
            payload["title"] = f"{title} · {payload['title']}"
        if depth is None:
            depth = ALL if len(payload["nodes"]["name"]) <= payload["budget"] else FIT
        names = frozenset(payload["nodes"]["name"])
        if kwargs.get("current", "") not in names:  # checked before opening, not fixed after
            kwargs["current"] = ""
        super().__init__(payload=payload, height=height, depth=depth, **kwargs)
        self.names = names


class DagCursor(DagWidget):
    """The stepper panel's DAG: a ring on the current node (and its twin)."""

    def __init__(self, joint: Any, height: int = 460, at: str | None = None,
                 **kwargs: Any) -> None:
        """See :class:`DagWidget`; the view is titled ``current node (ringed)``.

        ``at`` rings that node from the start: the ring goes in the widget's opening
        message, as ipywidgets 7's front end can drop an update sent just after it.
        """
        kwargs.setdefault("depth", FIT)  # as the payload opened it: the cursor follows
        super().__init__(joint, height=height, title="current node (ringed)",
                         css_class="jl-stepper-dag", current=at or "", **kwargs)

    def move(self, name: str | None) -> None:
        """Ring node ``name`` (or nothing)."""
        self.current = name if name in self.names else ""
