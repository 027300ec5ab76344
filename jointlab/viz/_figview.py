"""``PlotView``: a memory figure shown as inline SVG, a plotly figure on demand.

A plotly figure's first display in a fresh kernel cost seconds (10-16 s in
JupyterLab on a loaded machine): building it runs plotly's validators and
templates, its mime bundle imports ``plotly.io`` (with ``nbformat`` and
``jsonschema``), and the page loads plotly.js. A ``PlotView`` holds the figure
as plotly's figure dict and draws it with :func:`jointlab.viz._svgplot.figure_svg`
(the same drawing ``jl.export_figure`` writes), plus a small script for the
hover read-out of a line plot: no plotly is imported, nothing is fetched, and
the HTML works offline, in a saved notebook and in a report.

Every other attribute is the plotly figure's (``.data``, ``.layout``,
``.update_layout``, ``.write_html``, ``.show``), built once on first use from
the same dict. Once it is built, the view displays through plotly, so what is
shown is what that figure now says (an edit is never silently not drawn).
"""

from __future__ import annotations

import html
import json
import uuid
from typing import Any

import numpy as np

from jointlab.meta import module_label
from jointlab.viz import _svgplot

__all__ = ["PlotView"]

#: The hover read-out of a line plot: a vertical rule and a box at the nearest step.
_HOVER_JS = r"""
(function () {
  const root = document.getElementById("%(id)s");
  if (!root) return;
  const svg = root.querySelector("svg"), area = svg.querySelector("rect.plot-area");
  const D = JSON.parse(root.querySelector("script[type='application/json']").textContent);
  const tip = root.querySelector(".jl-tip"), rule = svg.querySelector("line.jl-rule");
  const left = +area.getAttribute("x"), w = +area.getAttribute("width");
  const x0 = +area.dataset.x0, x1 = +area.dataset.x1;
  const px = x => left + (x - x0) / ((x1 - x0) || 1) * w;
  function nearest(x) {
    let lo = 0, hi = D.x.length - 1;
    while (hi - lo > 1) { const m = (lo + hi) >> 1; if (D.x[m] <= x) lo = m; else hi = m; }
    return Math.abs(D.x[hi] - x) < Math.abs(D.x[lo] - x) ? hi : lo;
  }
  const hide = () => { tip.style.display = "none"; rule.style.display = "none"; };
  svg.addEventListener("mousemove", ev => {
    const pt = svg.createSVGPoint(); pt.x = ev.clientX; pt.y = ev.clientY;
    const p = pt.matrixTransform(svg.getScreenCTM().inverse());
    if (p.x < left || p.x > left + w) { hide(); return; }
    const i = nearest(x0 + (p.x - left) / w * (x1 - x0)), X = px(D.x[i]);
    rule.setAttribute("x1", X); rule.setAttribute("x2", X); rule.style.display = "";
    tip.textContent = D.rows[i];
    const box = root.getBoundingClientRect(), s = box.width / svg.viewBox.baseVal.width;
    tip.style.display = "block";
    const right = X * s + 12 + tip.offsetWidth > box.width;
    tip.style.left = (right ? X * s - 12 - tip.offsetWidth : X * s + 12) + "px";
    tip.style.top = (ev.clientY - box.top + 12) + "px";
  });
  svg.addEventListener("mouseleave", hide);
})();
"""

_STYLE = (".jl-plot{position:relative;max-width:880px}"
          ".jl-plot svg{width:100%;height:auto;display:block}"
          ".jl-plot .jl-tip{position:absolute;display:none;white-space:pre;pointer-events:none;"
          "background:#fff;border:1px solid #888;padding:4px 6px;font:12px system-ui,sans-serif;"
          "color:#1f2328;z-index:5;box-shadow:0 1px 4px rgba(0,0,0,.2)}")


def _hover_rows(spec: dict[str, Any], extra: list[list[str]] | None) -> dict[str, Any] | None:
    """Per step of a line plot: its x and the text the hover box shows (None: no lines)."""
    lines = [t for t in _svgplot.shown_traces(spec) if t.get("type", "scatter") == "scatter"
             and len(np.asarray(t["x"]).reshape(-1)) > 1]
    if not lines:
        return None
    xs = np.asarray(lines[0]["x"]).reshape(-1)
    same = [t for t in lines if np.array_equal(np.asarray(t["x"]).reshape(-1), xs)]
    # the totals first, then the stacked categories from the top of the stack down
    order = [t for t in same if not t.get("stackgroup")] + \
        [t for t in reversed(same) if t.get("stackgroup")]
    order = [t for t in order if t.get("hovertemplate")]
    rows = []
    for i in range(len(xs)):
        head = [f"step {xs[i]}"]
        if extra is not None:
            node, module, op, shape = extra[i]
            head = [f"step {xs[i]}: {node}", f"module {module_label(module)}", f"op {op}",
                    f"shape {shape}"]
        vals = [_svgplot.hover_text(t, i).splitlines()[-1] for t in order]
        rows.append("\n".join(head + vals))
    return {"x": xs.tolist(), "rows": rows}


class PlotView:
    """A line/area or bar figure: inline SVG in a notebook, the plotly figure on demand.

    Attributes:
        spec: The figure as plotly's figure dict.
    """

    def __init__(self, spec: dict[str, Any], hover: list[list[str]] | None = None,
                 width: int = 640) -> None:
        """Hold ``spec``; ``hover`` is per point of the lines: node, module, op, shape.

        ``width`` is the drawing's own width: the notebook scales it to the cell, so
        text keeps about its size in a cell of that width (a 1024 px window with
        JupyterLab's file browser open leaves about 590 px).
        """
        self.spec, self.width = spec, width
        self._hover = hover
        self._figure: Any = None

    @property
    def figure(self) -> Any:
        """The ``plotly.graph_objects.Figure`` of :attr:`spec` (built once, on first use)."""
        if self._figure is None:
            import plotly.graph_objects as go

            self._figure = go.Figure(self.spec)
        return self._figure

    def figure_dict(self) -> dict[str, Any]:
        """The figure dict to draw: the plotly figure's once built (edits included), else spec."""
        return self.spec if self._figure is None else _svgplot.figure_dict(self._figure)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # IPython's probes (_repr_png_, ...) must not build plotly
            raise AttributeError(name)
        import plotly.graph_objects as go

        if not hasattr(go.Figure, name):  # hasattr() probes do not build the figure either
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.figure, name)

    def svg(self, width: int | None = None) -> str:
        """The figure as an SVG document (``jl.export_figure``'s drawing), ``width`` px wide."""
        return _svgplot.figure_svg(self, width=width or self.width)

    def html(self) -> str:
        """The figure as an HTML fragment: scaled SVG, bar tooltips, a hover read-out of lines."""
        svg = self.svg()
        hover = _hover_rows(self.figure_dict(), self._hover)
        box = f"jl-plot-{uuid.uuid4().hex[:10]}"
        if hover is None:
            return f"<style>{_STYLE}</style><div class='jl-plot' id='{box}'>{svg}</div>"
        rule = ('<line class="jl-rule" x1="0" x2="0" y1="{t}" y2="{b}" stroke="#333" '
                'stroke-width="1" style="display:none;pointer-events:none"/>')
        top, bottom = _area_span(svg)
        svg = svg.replace("</svg>", rule.format(t=top, b=bottom) + "</svg>")
        data = (json.dumps(hover).replace("&", "\\u0026").replace("<", "\\u003c")
                .replace(">", "\\u003e"))  # model text never closes the script
        return (f"<style>{_STYLE}</style><div class='jl-plot' id='{box}'>{svg}"
                f"<div class='jl-tip'></div><script type='application/json'>{data}</script>"
                f"<script>{_HOVER_JS % {'id': box}}</script></div>")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, **kw: Any
                          ) -> dict[str, Any]:
        if self._figure is not None:  # the user has the plotly figure: show exactly it
            return self._figure._repr_mimebundle_(include, exclude, **kw)
        title = str(_svgplot.get_path(self.spec, "layout", "title", "text", default="figure"))
        return {"text/html": self.html(), "text/plain": f"<{html.unescape(title)}>"}

    def __repr__(self) -> str:
        title = str(_svgplot.get_path(self.spec, "layout", "title", "text", default="figure"))
        return f"<PlotView: {html.unescape(title)}>"


def _area_span(svg: str) -> tuple[str, str]:
    """Top and bottom y of the plot area in ``svg``."""
    head = svg.split('class="plot-area"', 1)[1]
    y = float(head.split('y="', 1)[1].split('"', 1)[0])
    h = float(head.split('height="', 1)[1].split('"', 1)[0])
    return f"{y:.1f}", f"{y + h:.1f}"
