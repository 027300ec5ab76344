"""A styled HTML summary of a :class:`jointlab.analysis.plan_check.PlanCheck`.

It reads the check's public fields only (``verdict``, ``ok``, ``first``, the
``loss`` and ``grads`` tables, ``notes``): the verdict as a badge, the first
differing parameter, then the gradients that differ or are not known first
and the rest one click away. Every string is escaped.
"""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

from jointlab.viz.comparison import COMPARISON_STYLE, table_html, tri_state

__all__ = ["plan_check_html"]

_WORD = {True: "yes", False: "DIFFERS", None: "not known"}
_STYLE = ".jl-cmp tr.jl-unknown td{background:#fff8c5} .jl-badge.unknown{background:#9a6700}"
SHOWN = 8


def _cell(col: str, v: Any) -> str:
    if col == "ok":
        return f"<td>{_WORD[tri_state(v)]}</td>"
    if isinstance(v, float):
        text = f"{v:.6g}" if col in ("loss", "reference") else f"{v:.3g}"
        return f"<td class='num'>{html.escape(text)}</td>"
    if isinstance(v, tuple):
        v = ", ".join(map(str, v))
    return f"<td>{html.escape(str(v))}</td>"


def _worst_first(grads: pd.DataFrame) -> pd.DataFrame:
    rank = grads["ok"].map(lambda v: 0 if v is False else 1 if v is None else 2)
    return grads.assign(_r=rank).sort_values(["_r", "rel_err"], ascending=[True, False],
                                             kind="stable").drop(columns="_r")


def plan_check_html(check: Any) -> str:
    """The styled summary of a plan check (see the module docstring).

    Args:
        check: A :class:`jointlab.analysis.plan_check.PlanCheck`.

    Returns:
        An HTML fragment with its style.
    """
    badge = {True: "ok", False: "bad", None: "unknown"}[check.ok]
    differ = int(check.grads["ok"].eq(False).sum()) if len(check.grads) else 0
    parts = [f"<style>{COMPARISON_STYLE}{_STYLE}</style><div class='jl-cmp'>"
             f"<span class='jl-badge {badge}'>{html.escape(check.verdict)}</span> "
             f"<span>{len(check.grads)} gathered gradients ({differ} differ) and "
             f"{len(check.loss)} ranks' losses against one eager step of the unsharded "
             "model</span>"]
    if check.first is not None:
        parts.append("<p>first differing gradient (backward order): "
                     f"<code>{html.escape(str(check.first))}</code></p>")
    parts += [f"<p class='jl-note'>{html.escape(n)}</p>" for n in check.notes]
    parts.append(table_html(check.loss, _cell))
    rows = _worst_first(check.grads)
    if len(rows):
        parts.append("<p class='jl-note'>gradients, worst first:</p>"
                     + table_html(rows.head(SHOWN), _cell))
    if len(rows) > SHOWN:
        parts.append(f"<details><summary>all {len(rows)} gradients</summary>"
                     f"{table_html(check.grads, _cell)}</details>")
    return "".join(parts) + "</div>"
