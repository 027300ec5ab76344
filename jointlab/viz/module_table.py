"""The module summary table: ``jl.module_summary``'s DataFrame laid out for a notebook.

:func:`module_summary_html` lays out the DataFrame ``jl.module_summary``
returns: modules indented by nesting, parameter counts as ``166.7 k``,
FLOPs as ``10.5 MFLOP``, bytes as ``526 KiB``, times as ``287 ms``, shapes
as ``2×16×64``, tied weights named. Bars in the FLOP and time cells show
each module's share of the whole model's (the root row's) total. Numbers
are not recomputed, only formatted; every string from the model is escaped.
:class:`jointlab.analysis.modules.ModuleTable` wraps the frame and hands its display
here through :func:`jointlab.display.rich_html`.
Plain HTML: no plotly. Any other table is drawn by :mod:`jointlab.viz.frames`.
"""

from __future__ import annotations

import html
import math
from typing import Any

import pandas as pd

from jointlab.meta import ROOT_LABEL
from jointlab.units import human_bytes, human_count, human_seconds

__all__ = ["module_summary_html"]

_STYLE = (
    "<style>.jl-mods{border-collapse:collapse;font:12px system-ui,sans-serif}"
    ".jl-mods th{background:#f2f4f7;text-align:right;padding:3px 8px;border-bottom:1px solid #ccc}"
    ".jl-mods th.l,.jl-mods td.l{text-align:left}"
    ".jl-mods td{text-align:right;padding:2px 8px;border-bottom:1px solid #eee;"
    "font-variant-numeric:tabular-nums;white-space:nowrap}"
    ".jl-mods tr.root td{font-weight:600;background:#fafbfc}"
    ".jl-mods .ty{color:#777}.jl-mods .tied{color:#b36b00}</style>")
#: (header, column(s), formatter kind); ``share`` kinds draw a bar of the root's total.
COLUMNS = (
    ("params", "params", "count"), ("trainable", "trainable", "count"),
    ("in", "in_shapes", "shapes"), ("out", "out_shapes", "shapes"),
    ("FLOPs fwd", "flops_fwd", "flops"), ("FLOPs bwd", "flops_bwd", "flops"),
    ("bytes fwd", "bytes_fwd", "bytes"), ("bytes bwd", "bytes_bwd", "bytes"),
    ("time fwd", "time_fwd_s", "time"), ("time bwd", "time_bwd_s", "time"),
)


def _shapes(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return ", ".join("×".join(map(str, s)) if s else "scalar" for s in v)


def _cell(kind: str, v: Any) -> str:
    if kind == "count":
        return human_count(int(v))
    if kind == "flops":
        return human_count(int(v), "FLOP") if v else "0"
    if kind == "bytes":
        return human_bytes(int(v))
    if kind == "time":
        return human_seconds(float(v))
    return _shapes(v)


def _unknown(row: pd.Series, col: str) -> str:
    """`` + unknown (N nodes)`` after a FLOPs cell whose module has nodes of unknown FLOPs."""
    key = col.replace("flops_", "flops_unknown_", 1) if col.startswith("flops_") else ""
    n = int(row.get(key, 0) or 0) if key else 0
    return f" + unknown ({n} node{'s' if n > 1 else ''})" if n else ""


def _bar(value: float, total: float) -> str:
    """A background bar of ``value / total`` (none when the total is unknown or zero)."""
    if not total or not value or math.isnan(total) or math.isnan(value):
        return ""
    pct = max(0.0, min(100.0, 100.0 * value / total))
    return (f" style='background:linear-gradient(90deg,#dbe8f6 {pct:.1f}%,"
            f"transparent {pct:.1f}%)' title='{pct:.1f}% of the model'")


def _module_cell(name: str, row: pd.Series) -> str:
    depth = len(name.split(".")) if name else 0
    label = html.escape(name.rsplit(".", 1)[-1] if name else ROOT_LABEL)
    tied = f" <span class='tied'>tied: {html.escape(row['tied'])}</span>" if row["tied"] else ""
    return (f"<td class='l' style='padding-left:{8 + 14 * depth}px' title='{html.escape(name)}'>"
            f"{label} <span class='ty'>{html.escape(str(row['type']))}</span>{tied}</td>")


def module_summary_html(df: pd.DataFrame, *, max_rows: int = 500) -> str:
    """The styled HTML table of a ``jl.module_summary`` frame.

    Args:
        df: What :func:`jointlab.module_summary` returned (indexed by module FQN).
        max_rows: Show at most this many rows (a note says how many were left out).

    Returns:
        HTML text, one ``<tr>`` per shown module; strings escaped.
    """
    total = df.loc[""] if "" in df.index else None
    heads = "".join(f"<th>{html.escape(h)}</th>" for h, _, _ in COLUMNS)
    rows = [f"{_STYLE}<table class='jl-mods'><thead><tr><th class='l'>module</th>{heads}"
            "</tr></thead><tbody>"]
    for name, row in df.head(max_rows).iterrows():
        cells = [_module_cell(str(name), row)]
        for _, col, kind in COLUMNS:
            bar = _bar(row[col], total[col]) if total is not None and kind in (
                "flops", "time") else ""
            cells.append(f"<td{bar}>{html.escape(_cell(kind, row[col]) + _unknown(row, col))}</td>")
        cls = " class='root'" if name == "" else ""
        rows.append(f"<tr{cls}>{''.join(cells)}</tr>")
    rows.append("</tbody></table>")
    if len(df) > max_rows:
        rows.append(f"<div>… {len(df) - max_rows} more modules (pass depth= to "
                    "jl.module_summary for fewer)</div>")
    if df.attrs.get("in_shapes"):
        rows.append(f"<div class='ty'>input shapes: {html.escape(df.attrs['in_shapes'])}</div>")
    return "".join(rows)
