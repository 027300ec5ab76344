"""A styled HTML summary of a :class:`jointlab.Comparison`, for the report.

It reads only the comparison's public fields (``verdict``, ``ok``, ``exact``,
the ``loss``/``grads``/``loss_dict``/``buffers`` tables, ``first_divergence``,
``first_inexact``, ``notes``, ``unchecked``): the verdict as a badge, counts of
what was checked, the first divergence, then the compared tensors worst first
(beyond tolerance, then largest relative error), the first few shown and the
rest one click away. Every string is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import pandas as pd

__all__ = ["COMPARISON_STYLE", "comparison_html", "table_html", "tri_state", "worst_first"]

#: How many compared tensors are shown before the "all N" fold.
SHOWN = 8
COMPARISON_STYLE = """
.jl-cmp{font-size:13px}
.jl-badge{display:inline-block;padding:3px 10px;border-radius:12px;color:#fff;font-weight:600}
.jl-badge.ok{background:#1a7f37} .jl-badge.bad{background:#cf222e}
.jl-cmp table{border-collapse:collapse;font-size:12px;margin-top:6px}
.jl-cmp th{background:#f3f3f3;text-align:left} .jl-cmp td.num{text-align:right}
.jl-cmp td,.jl-cmp th{padding:2px 8px;border-bottom:1px solid #eee;white-space:nowrap}
.jl-cmp tr.jl-fail td{background:#ffebe9}
"""
_COLUMNS = ("kind", "name", "shape", "dtype", "max_abs_err", "max_rel_err", "cosine", "exact",
            "ok")


def worst_first(comparison: Any) -> pd.DataFrame:
    """Every compared tensor in one table, worst first.

    Args:
        comparison: A :class:`jointlab.Comparison`.

    Returns:
        Rows of the loss, gradient, loss_dict and buffer tables with a ``kind``
        column; those beyond tolerance first, then by relative and absolute
        error, largest first.
    """
    parts = [df.assign(kind=kind) for kind, df in (
        ("loss", comparison.loss), ("gradient", comparison.grads),
        ("loss_dict", comparison.loss_dict), ("buffer", comparison.buffers)) if len(df)]
    if not parts:
        return pd.DataFrame(columns=list(_COLUMNS))
    rows = pd.concat(parts, ignore_index=True)
    cols = [c for c in _COLUMNS if c in rows.columns]
    return rows.sort_values(["ok", "max_rel_err", "max_abs_err"], ascending=[True, False, False],
                            kind="stable")[cols].reset_index(drop=True)


def _cell(col: str, v: Any) -> str:
    if isinstance(v, float):
        text = f"{v:.6f}" if col == "cosine" else f"{v:.3g}"
        return f"<td class='num'>{html.escape(text)}</td>"
    if isinstance(v, (bool,)) or type(v).__name__ == "bool_":
        return f"<td>{'yes' if v else 'no'}</td>"
    return f"<td>{html.escape(str(v))}</td>"


#: A row's class by its ``ok``: a fail is marked, a "not known" (None/NaN) too.
_ROW_STATE = {True: "", False: " class='jl-fail'", None: " class='jl-unknown'"}


def tri_state(ok: Any) -> bool | None:
    """An ``ok`` cell as True, False or None (not known: None or NaN)."""
    return None if ok is None or pd.isna(ok) else bool(ok)


def table_html(rows: pd.DataFrame, cell: Callable[[str, Any], str] = _cell) -> str:
    """``rows`` as an HTML table, each row marked by its ``ok`` (rows without one: unmarked).

    Args:
        rows: The table to show (column names become the headers).
        cell: ``(column, value) -> "<td>...</td>"`` (default: this module's).

    Returns:
        The ``<table>`` fragment; style it with :data:`COMPARISON_STYLE`.
    """
    head = "".join(f"<th>{html.escape(c.replace('_', ' '))}</th>" for c in rows.columns)
    body = []
    for rec in rows.to_dict("records"):
        state = _ROW_STATE[tri_state(rec.get("ok", True))]
        body.append(f"<tr{state}>" + "".join(cell(c, v) for c, v in rec.items()) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def comparison_html(comparison: Any) -> str:
    """The styled summary of a comparison (see the module docstring).

    Args:
        comparison: A :class:`jointlab.Comparison`.

    Returns:
        An HTML fragment; pair it with :data:`COMPARISON_STYLE`.
    """
    rows = worst_first(comparison)
    failing = int((~rows["ok"].astype(bool)).sum()) if len(rows) else 0
    exact = int(rows["exact"].astype(bool).sum()) if len(rows) else 0
    badge = "ok" if comparison.ok else "bad"
    parts = [f"<div class='jl-cmp'><span class='jl-badge {badge}'>"
             f"{html.escape(str(comparison.verdict))}</span> "
             f"<span>{len(rows)} tensors compared: {exact} bit-exact, "
             f"{failing} beyond tolerance</span>"]
    first, inexact = comparison.first_divergence, comparison.first_inexact
    if first is not None:
        parts.append(f"<p>first divergence: <code>{html.escape(str(first))}</code></p>")
    if inexact is not None and (first is None or inexact.node != first.node):
        parts.append(f"<p>first inexact node: <code>{html.escape(str(inexact))}</code></p>")
    if not comparison.exact:
        parts += [f"<p class='jl-note'>{html.escape(n)}</p>" for n in comparison.notes]
    if comparison.unchecked:
        parts.append("<p class='jl-note'>not checked module by module: "
                     f"{html.escape(', '.join(comparison.unchecked))}</p>")
    if len(rows):
        parts.append(f"<p class='jl-note'>worst first (largest relative error):</p>"
                     f"{table_html(rows.head(SHOWN))}")
        if len(rows) > SHOWN:
            parts.append(f"<details><summary>all {len(rows)} tensors</summary>"
                         f"{table_html(rows)}</details>")
    return "".join(parts) + "</div>"
