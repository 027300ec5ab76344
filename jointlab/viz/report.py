"""``jointlab.report``: one self-contained HTML file about a JointGraph.

The page holds the summary card, a sortable and filterable node table, the
DAG, the memory plot and, given a model and inputs, the comparison with
eager. plotly.js is inlined once; nothing is fetched from a CDN or a server.
Every string that comes from the model is treated as data: table cells are
written with ``textContent`` from escaped JSON, and the HTML fragments come
from renderers that escape their own text.
"""

from __future__ import annotations

import html
import json
import pathlib
from typing import Any

from torch import nn

from jointlab.core import TracedGraph as JointGraph

TABLE_COLUMNS = ["phase", "module", "target", "shape", "dtype", "bytes", "flops", "category",
                 "saved_for_backward", "stack_trace"]

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222}
h1{font-size:22px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table.jl-nodes{border-collapse:collapse;font-size:12px;width:100%}
table.jl-nodes th{cursor:pointer;background:#f3f3f3;position:sticky;top:0;text-align:left}
table.jl-nodes td,table.jl-nodes th{padding:2px 6px;border-bottom:1px solid #eee;white-space:nowrap}
#jl-filter{width:360px;padding:4px;margin:6px 0}
.jl-note{color:#666;font-size:12px}
.jl-scroll{max-height:460px;overflow:auto;border:1px solid #ddd}
"""

_TABLE_JS = """
(function(){
  const data = JSON.parse(document.getElementById('jl-node-data').textContent);
  const cols = data.columns, rows = data.rows, PAGE = 200;
  let shown = rows, sortCol = -1, asc = true;
  const table = document.getElementById('jl-nodes');
  const info = document.getElementById('jl-count');
  function head(){
    const tr = document.createElement('tr');
    ['name'].concat(cols).forEach((c, i) => {
      const th = document.createElement('th'); th.textContent = c;
      th.onclick = () => { asc = sortCol === i ? !asc : true; sortCol = i; sort(); draw(); };
      tr.appendChild(th);
    });
    table.tHead.appendChild(tr);
  }
  function sort(){
    const k = sortCol;
    shown = shown.slice().sort((a, b) => {
      const x = a[k], y = b[k];
      const num = typeof x === 'number' && typeof y === 'number';
      const c = num ? x - y : String(x).localeCompare(String(y));
      return asc ? c : -c;
    });
  }
  function draw(){
    const body = table.tBodies[0]; body.textContent = '';
    shown.slice(0, PAGE).forEach(r => {
      const tr = document.createElement('tr');
      r.forEach(v => {
        const td = document.createElement('td');
        td.textContent = v === null ? '' : String(v);
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    const more = shown.length > PAGE ? ' (first ' + PAGE + ' shown)' : '';
    info.textContent = shown.length + ' of ' + rows.length + ' nodes' + more;
  }
  document.getElementById('jl-filter').addEventListener('input', e => {
    const q = e.target.value.toLowerCase();
    shown = rows.filter(r => r.some(v => String(v).toLowerCase().includes(q)));
    if (sortCol >= 0) sort();
    draw();
  });
  head(); draw();
})();
"""


def _json_for_script(obj: Any) -> str:
    """JSON that is safe inside ``<script>``: no ``<``, ``>`` or ``&`` can close the tag."""
    text = json.dumps(obj, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _table_data(joint: JointGraph) -> dict[str, Any]:
    df = joint.nodes
    cols = [c for c in TABLE_COLUMNS if c in df.columns]
    rows = []
    for name, rec in zip(df.index, df[cols].itertuples(index=False, name=None)):
        rows.append([str(name), *(_cell(v) for v in rec)])
    return {"columns": cols, "rows": rows}


def _cell(v: Any) -> Any:
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, float)):
        return v if v == v else None  # NaN -> empty
    if hasattr(v, "item"):
        return v.item()
    return str(v)


def _figure_div(fig: Any) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, config={"responsive": True})


def sections(joint: JointGraph, model: nn.Module | None, inputs: dict[str, Any] | None,
             comparison: Any = None) -> list[tuple[str, str]]:
    """Build the report's ``(title, html)`` sections.

    Args:
        joint: The traced graph.
        model: Optional model; with ``inputs`` enables measured memory and the comparison.
        inputs: Optional inputs for the model.
        comparison: A :class:`jointlab.Comparison` already computed for them (else computed).

    Returns:
        Section titles and their HTML bodies, in page order.
    """
    from jointlab.viz import plot_dag, plot_memory

    live = model is not None and inputs is not None
    out = [("Summary", joint._repr_html_())]
    out.append(("Nodes", (
        '<input id="jl-filter" placeholder="filter: op, module, phase, source ...">'
        ' <span id="jl-count" class="jl-note"></span>'
        '<div class="jl-scroll"><table id="jl-nodes" class="jl-nodes"><thead></thead>'
        '<tbody></tbody></table></div>'
        f'<script type="application/json" id="jl-node-data">{_json_for_script(_table_data(joint))}'
        "</script>"
    )))
    out.append(("Forward/backward DAG", _figure_div(plot_dag(joint))))
    profile = joint.memory(model=model, inputs=inputs) if live else joint.memory()
    out.append(("Memory", _figure_div(plot_memory(profile))))
    if live:
        if comparison is None:
            from jointlab.analysis.compare.compare import compare

            comparison = compare(joint, model, inputs)
        out.append(("Comparison with eager", comparison._repr_html_()))
    return out


def report(joint: JointGraph, path: str | pathlib.Path, *, model: nn.Module | None = None,
           inputs: dict[str, Any] | None = None, title: str = "jointlab report",
           comparison: Any = None) -> pathlib.Path:
    """Write a self-contained HTML report of ``joint`` to ``path``.

    Args:
        joint: The traced graph.
        path: Output file; parent folders are created.
        model: With ``inputs``, also measure memory and compare with eager.
        inputs: Inputs for ``model``.
        title: Page title (escaped).
        comparison: A comparison already computed for ``model`` and ``inputs``.

    Returns:
        The path written.
    """
    from plotly.offline import get_plotlyjs

    body = "".join(f"<h2>{html.escape(t)}</h2>\n<section>{h}</section>\n"
                   for t, h in sections(joint, model, inputs, comparison))
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style>"
        f"<script>{get_plotlyjs()}</script></head><body>"
        f"<h1>{html.escape(title)}</h1>{body}<script>{_TABLE_JS}</script></body></html>"
    )
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out
