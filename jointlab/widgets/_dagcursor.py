"""``DagCursor``: the stepper panel's DAG, the bundled canvas renderer with a ring on one node.

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
and the current node name as synced *state*, and its small module
(:data:`jointlab.viz.dagview.JS_PATH` plus a few lines of glue) draws from
that state whenever a view is mounted, once the element is in the document
(the renderer sizes its canvas from it), and again after every change of
``current``. Nothing depends on the order in which messages arrive.
"""

from __future__ import annotations

from typing import Any

import anywidget
import traitlets

from jointlab.viz.dagview import JS_PATH, build_payload

__all__ = ["DagCursor"]

_GLUE = r"""
function ring(view, model) {
  const i = view.P.nodes.name.indexOf(model.get("current"));
  view.selected = i;
  if (i >= 0) {
    view.reveal(i); view.update();
    const [sx, sy] = view.toScreen(view.x[i], view.y[i]), c = view.canvas;
    const W = c.clientWidth, H = c.clientHeight;
    if (W && H && (sx < 20 || sy < 20 || sx > W - 20 || sy > H - 20)) {  // keep it on screen
      view.vx = view.x[i] - W / 2 / view.k; view.vy = view.y[i] + H / 2 / (view.k * view.ay);
    }
  }
  view.draw();
}

export default {
  render({ model, el }) {
    const id = "jl-dag-" + Math.random().toString(36).slice(2, 10);
    const root = document.createElement("div");
    root.className = "jl-dag jl-stepper-dag"; root.id = id;
    root.style.height = model.get("height") + "px";
    const data = document.createElement("script");
    data.type = "application/json"; data.id = id + "-data";
    data.textContent = JSON.stringify(model.get("payload"));
    el.appendChild(root); el.appendChild(data);
    let view = null, gone = false;
    const onCurrent = () => { if (view) ring(view, model); };
    const mount = () => {  // ipywidgets may render before the element is in the document
      if (gone) return;
      if (!root.isConnected) { requestAnimationFrame(mount); return; }
      view = window.jointlabDag(id);
      ring(view, model);
      root.dataset.ready = "1";
    };
    mount();
    model.on("change:current", onCurrent);
    return () => { gone = true; model.off("change:current", onCurrent); };
  },
};
"""


def _esm() -> str:
    return JS_PATH.read_text(encoding="utf-8") + "\n" + _GLUE


class DagCursor(anywidget.AnyWidget):
    """The joint graph's DAG with a ring on the stepper's current node (and its twin).

    Attributes:
        payload: What the renderer draws (:func:`jointlab.viz.dagview.build_payload`).
        current: Name of the ringed node; ``""`` rings nothing.
        height: Canvas height in pixels.
    """

    _esm = traitlets.Unicode(_esm()).tag(sync=True)
    payload = traitlets.Dict().tag(sync=True)
    current = traitlets.Unicode("").tag(sync=True)
    height = traitlets.Int(380).tag(sync=True)

    def __init__(self, joint: Any, height: int = 380, **kwargs: Any) -> None:
        """Build the payload of ``joint`` once; :meth:`move` only changes ``current``.

        Args:
            joint: A traced joint graph.
            height: Canvas height in pixels.
            **kwargs: More ``anywidget.AnyWidget`` keywords.
        """
        payload = build_payload(joint)
        payload["title"] = "current node (ringed) · " + payload["title"]
        super().__init__(payload=payload, height=height, **kwargs)
        self.names = frozenset(payload["nodes"]["name"])

    def move(self, name: str | None) -> None:
        """Ring node ``name`` (or nothing)."""
        self.current = name if name in self.names else ""
