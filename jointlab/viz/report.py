"""The HTML of ``jl.report``: one self-contained page about a traced graph.

A renderer only: it is given the node table, the memory profile, the
comparison and the versions (computed by :func:`jointlab.reporting.report`)
and runs no analysis itself.

The page opens with a header (model class, parameter count, mode, date,
jointlab and torch versions) and holds the summary card, a sortable,
filterable and paged node table (compute nodes first, sizes in human units
with exact values on hover, the root module's own ops labelled ``(root)
<ModelClass>``), the navigable DAG (:func:`jointlab.viz.dagview.dag_view`: labels,
click-expand by module, search, detail panel; a canvas renderer inlined with its
payload), the memory plot and, given a model and inputs, a summary of the
comparison with eager (:mod:`jointlab.viz.comparison`). Each section opens with
one sentence saying what it shows. plotly.js (for the memory plot) and the DAG
renderer are inlined once; nothing is fetched from a CDN or a server.
Every string that comes from the model is treated as data: table cells are
written with ``textContent`` from escaped JSON, and the HTML fragments come
from renderers that escape their own text.
"""

from __future__ import annotations

import html
import json
import pathlib
from dataclasses import dataclass
from typing import Any

import pandas as pd

from jointlab.analysis.tables import card_facts
from jointlab.core import TracedGraph
from jointlab.viz.cards import summary_card_html
from jointlab.viz.comparison import COMPARISON_STYLE, comparison_html

TABLE_COLUMNS = ["phase", "module", "target", "shape", "dtype", "bytes", "flops", "category",
                 "saved_for_backward", "stack_trace"]

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.jl-header{color:#444;font-size:13px;margin-bottom:8px} .jl-header b{color:#222}
.jl-lede{color:#555;font-size:13px;margin:4px 0 8px}
table.jl-nodes{border-collapse:collapse;font-size:12px;width:100%}
table.jl-nodes th{cursor:pointer;background:#f3f3f3;position:sticky;top:0;text-align:left;
  user-select:none}
table.jl-nodes th[aria-sort=ascending]::after{content:" \\25B2";font-size:10px}
table.jl-nodes th[aria-sort=descending]::after{content:" \\25BC";font-size:10px}
table.jl-nodes td,table.jl-nodes th{padding:2px 6px;border-bottom:1px solid #eee;white-space:nowrap}
table.jl-nodes td.num{text-align:right}
table.jl-nodes td.jl-wrap{white-space:normal;overflow-wrap:anywhere;max-width:260px}
table.jl-nodes td.jl-src{white-space:normal;overflow-wrap:anywhere;min-width:160px}
.jl-tools{margin:6px 0} .jl-tools button{margin:0 2px}
#jl-filter{width:360px;padding:4px}
.jl-note{color:#666;font-size:12px}
.jl-scroll{max-height:560px;overflow:auto;border:1px solid #ddd}
"""

_TABLE_JS = """
(function(){
  const data = JSON.parse(document.getElementById('jl-node-data').textContent);
  const cols = data.columns, rows = data.rows, PAGE = 100;
  const phase = cols.indexOf('phase') + 1, src = cols.indexOf('stack_trace') + 1;
  const module = cols.indexOf('module') + 1, mtype = data.module_types;
  const WRAP = new Set(['name', 'module', 'target']);
  const COMPUTE = new Set(['forward', 'backward']);
  let shown = rows, sortCol = -1, asc = true, page = 0;
  const table = document.getElementById('jl-nodes');
  const info = document.getElementById('jl-count'), where = document.getElementById('jl-page');
  const all = document.getElementById('jl-all'), filter = document.getElementById('jl-filter');
  function human(v, col){
    if (typeof v !== 'number') return null;
    const bytes = col === 'bytes', base = bytes ? 1024 : 1000;
    const units = bytes ? ['B', 'KiB', 'MiB', 'GiB', 'TiB'] : ['', 'k', 'M', 'G', 'T', 'P'];
    let x = v, i = 0;
    while (Math.abs(x) >= base && i < units.length - 1) { x /= base; i++; }
    const num = i === 0 ? String(x) : x.toPrecision(3);
    return bytes ? num + ' ' + units[i] : num + (units[i] ? ' ' + units[i] : '');
  }
  function head(){
    const tr = document.createElement('tr');
    ['name'].concat(cols).forEach((c, i) => {
      const th = document.createElement('th'); th.textContent = c;
      th.title = 'sort by ' + c;
      th.onclick = () => {
        asc = sortCol === i ? !asc : true; sortCol = i; sort(); page = 0; draw();
      };
      tr.appendChild(th);
    });
    table.tHead.appendChild(tr);
  }
  function marks(){
    [...table.tHead.rows[0].cells].forEach((th, i) => {
      if (i === sortCol) th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
      else th.removeAttribute('aria-sort');
    });
  }
  function sort(){
    const k = sortCol;
    if (k < 0) return;
    shown = shown.slice().sort((a, b) => {
      const x = a[k], y = b[k];
      const num = typeof x === 'number' && typeof y === 'number';
      const c = num ? x - y : String(x).localeCompare(String(y));
      return asc ? c : -c;
    });
  }
  function select(){
    const q = filter.value.toLowerCase();
    shown = rows.filter(r => (all.checked || COMPUTE.has(r[phase])) &&
                             (!q || r.some(v => String(v).toLowerCase().includes(q))));
    sort(); page = 0;
  }
  function pages(){ return Math.max(1, Math.ceil(shown.length / PAGE)); }
  function draw(){
    page = Math.min(Math.max(page, 0), pages() - 1);
    const body = table.tBodies[0]; body.textContent = '';
    shown.slice(page * PAGE, (page + 1) * PAGE).forEach(r => {
      const tr = document.createElement('tr');
      r.forEach((v, i) => {
        const td = document.createElement('td');
        const col = i === 0 ? 'name' : cols[i - 1];
        const h = (col === 'bytes' || col === 'flops') ? human(v, col) : null;
        td.textContent = h !== null ? h : (v === null ? '' : String(v));
        if (i === module && v === '' && mtype[r[0]]) td.textContent = '(root) ' + mtype[r[0]];
        if (h !== null) {
          td.title = v.toLocaleString('en-US') + (col === 'bytes' ? ' bytes' : ' FLOPs');
          td.className = 'num';
        }
        if (i === src) td.className = 'jl-src';
        else if (WRAP.has(col)) td.className = 'jl-wrap';
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    const hidden = all.checked ? '' : ' (compute nodes; placeholders and output hidden)';
    info.textContent = shown.length + ' of ' + rows.length + ' nodes' + hidden;
    where.textContent = 'page ' + (page + 1) + ' of ' + pages();
    marks();
  }
  document.getElementById('jl-prev').onclick = () => { page--; draw(); };
  document.getElementById('jl-next').onclick = () => { page++; draw(); };
  filter.addEventListener('input', () => { select(); draw(); });
  all.addEventListener('change', () => { select(); draw(); });
  head(); select(); draw();
})();
"""

#: One sentence per section: what it shows.
LEDES = {
    "Summary": "Node counts per phase, parameters, FLOPs and the bytes saved for the backward.",
    "Nodes": "Every node of the joint graph, forward and backward; click a header to sort, "
             "filter by any text, hover a size for its exact value.",
    "Forward/backward DAG": "The graph's data flow: forward on top, the backward mirrored "
                            "below; click a module box to open it, search an op or module, "
                            "click a node for its row, twin, inputs and users.",
    "Memory": "Live bytes after each node step by category, the predicted peak, and the "
              "measured allocations when a model was given.",
    "Comparison with eager": "The graph's loss and gradients against eager autograd from the "
                             "same seed, the worst tensors first.",
}


def _json_for_script(obj: Any) -> str:
    """JSON that is safe inside ``<script>``: no ``<``, ``>`` or ``&`` can close the tag."""
    text = json.dumps(obj, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _table_data(df: pd.DataFrame) -> dict[str, Any]:
    cols = [c for c in TABLE_COLUMNS if c in df.columns]
    rows = []
    for name, rec in zip(df.index, df[cols].itertuples(index=False, name=None)):
        rows.append([str(name), *(_cell(v) for v in rec)])
    return {"columns": cols, "rows": rows, "module_types": root_module_types(df)}


def root_module_types(df: pd.DataFrame) -> dict[str, str]:
    """Per node of the root module's own ops, the model's class (shown ``(root) <class>``).

    A node outside every module (the loss in ``train_fn``, placeholders) has module
    ``""`` and no module type, so it stays blank: only ops the root module ran are named.

    Args:
        df: The graph's node table (``joint.nodes``).

    Returns:
        ``{node_name: module_type}`` for nodes with module ``""`` and a known type.
    """
    if "module" not in df.columns or "module_type" not in df.columns:
        return {}
    own = (df["module"] == "") & (df["module_type"].fillna("") != "")
    return {str(k): str(v) for k, v in df.loc[own, "module_type"].items()}


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


@dataclass(frozen=True)
class ReportData:
    """Everything the report shows, computed before it is rendered.

    Attributes:
        joint: The traced graph (its summary card and DAG).
        nodes: Its node table (``joint.nodes``).
        memory: Its memory profile (measured too when a model was given).
        comparison: A :class:`jointlab.Comparison` with eager, or None.
        model_class: The model's class name ("" when unknown: the graph's root class is used).
        versions: ``(name, version)`` pairs for the header (jointlab, torch).
    """

    joint: TracedGraph
    nodes: pd.DataFrame
    memory: Any
    comparison: Any = None
    model_class: str = ""
    versions: tuple[tuple[str, str], ...] = ()


def sections(data: ReportData) -> list[tuple[str, str]]:
    """Build the report's ``(title, html)`` sections.

    Args:
        data: The computed results.

    Returns:
        Section titles and their HTML bodies, in page order.
    """
    from jointlab.viz import plot_memory
    from jointlab.viz.dagview import dag_view

    out = [("Summary", summary_card_html(data.joint))]
    out.append(("Nodes", (
        '<div class="jl-tools"><input id="jl-filter" '
        'placeholder="filter: op, module, phase, source ..."> '
        '<label><input type="checkbox" id="jl-all"> show placeholders and output</label> '
        '<button id="jl-prev" type="button">&lsaquo; prev</button>'
        '<span id="jl-page" class="jl-note"></span>'
        '<button id="jl-next" type="button">next &rsaquo;</button> '
        '<span id="jl-count" class="jl-note"></span></div>'
        '<div class="jl-scroll"><table id="jl-nodes" class="jl-nodes"><thead></thead>'
        '<tbody></tbody></table></div>'
        '<script type="application/json" id="jl-node-data">'
        f"{_json_for_script(_table_data(data.nodes))}</script>"
    )))
    out.append(("Forward/backward DAG", dag_view(data.joint, height=620).html()))
    out.append(("Memory", _figure_div(plot_memory(data.memory))))
    if data.comparison is not None:
        out.append(("Comparison with eager", comparison_html(data.comparison)))
    return out


def header_html(data: ReportData, date: str) -> str:
    """The line under the title: model class, parameters, mode, date, versions.

    Args:
        data: The computed results (model class, versions).
        date: The date to show.

    Returns:
        An HTML fragment, every value escaped.
    """
    facts = card_facts(data.joint)
    cls = data.model_class or _root_class(data.nodes)
    items = [("model", cls or "unknown"), ("parameters", f"{facts['param_numel']:,}"),
             ("mode", facts["mode"]), ("date", date), *data.versions]
    return "<div class='jl-header'>" + " · ".join(
        f"{html.escape(k)} <b>{html.escape(str(v))}</b>" for k, v in items) + "</div>"


def _root_class(df: pd.DataFrame) -> str:
    root = df["module_type"][(df["module"] == "") & (df["module_type"] != "")]
    return str(root.iloc[0]) if len(root) else ""


def write_report(data: ReportData, path: str | pathlib.Path, *, title: str, date: str
                 ) -> pathlib.Path:
    """Write the self-contained HTML report of ``data`` to ``path``.

    Args:
        data: The computed results.
        path: Output file; parent folders are created.
        title: Page title (escaped).
        date: The date shown in the header.

    Returns:
        The path written.
    """
    from plotly.offline import get_plotlyjs

    body = "".join(f"<h2>{html.escape(t)}</h2>\n<p class='jl-lede'>{html.escape(LEDES.get(t, ''))}"
                   f"</p>\n<section>{h}</section>\n"
                   for t, h in sections(data))
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}{COMPARISON_STYLE}</style>"
        f"<script>{get_plotlyjs()}</script></head><body>"
        f"<h1>{html.escape(title)}</h1>{header_html(data, date)}{body}"
        f"<script>{_TABLE_JS}</script></body></html>"
    )
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out
