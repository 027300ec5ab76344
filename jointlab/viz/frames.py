"""jointlab's tables in a notebook: human units, numbers never wrapped.

:func:`frame_html` draws any jointlab DataFrame (``joint.nodes``, ``joint.summary()``,
``rec.table``, their slices and joins) as pandas draws it, with the columns that
:func:`jointlab.units.column_unit` recognises shown in human units (``3 MiB``,
``1.2 GFLOP``, ``45.6 µs``) and ``white-space: nowrap`` on the cells of number and
shape columns, so a number such as ``-7.275958e-12`` never breaks across lines.
The frame keeps its raw numbers; only its display changes.
"""

from __future__ import annotations

import uuid

import pandas as pd

from jointlab.units import column_unit, human_value

__all__ = ["FRAME_STYLE", "frame_html"]

#: Scoped to the ``jl-frame`` class that :func:`frame_html` gives its tables.
FRAME_STYLE = ("<style>table.jl-frame td{font-variant-numeric:tabular-nums}"
               "table.jl-frame th{white-space:nowrap}"
               # a front end without its own table style (a widget's HTML in ipywidgets 7's
               # classic notebook) would otherwise run the headers together
               "table.jl-frame th,table.jl-frame td{padding:0.2em 0.5em}</style>")

def _unbroken(col: pd.Series) -> bool:
    """A column of numbers or shapes (tuples): its cells must not break across lines."""
    if pd.api.types.is_numeric_dtype(col.dtype):
        return True
    first = col.dropna().head(1)
    return bool(len(first)) and isinstance(first.iloc[0], tuple)


def _nowrap_css(df: pd.DataFrame, table_id: str, max_cols: int | None) -> str:
    """``white-space: nowrap`` on the cells of number and shape columns of table ``table_id``.

    Text columns (modules, sources, names) may wrap. When pandas truncates the columns,
    positions shift, so every cell is kept on one line instead.
    """
    if max_cols and len(df.columns) > max_cols:
        return f"#{table_id} td{{white-space:nowrap}}"
    skip = df.index.nlevels  # the index's header cells come first in every row
    cells = [f"#{table_id} td:nth-child({skip + k + 1})"
             for k, c in enumerate(df.columns) if _unbroken(df[c])]
    return ",".join(cells) + "{white-space:nowrap}" if cells else ""


def frame_html(df: pd.DataFrame) -> str:
    """``df`` as pandas' notebook HTML, in human units, no number or shape wrapped.

    Rows and columns are truncated as pandas truncates them (``display.max_rows``,
    ``display.min_rows``, ``display.max_columns``); only the shown cells are formatted.
    Cells of number and shape columns never break across lines (``white-space:
    nowrap``), so ``-7.275958e-12`` stays whole; text columns may wrap.

    Args:
        df: Any DataFrame; columns named by jointlab's conventions get units.

    Returns:
        HTML text: a scoped style and the table (class ``dataframe jl-frame``).
    """
    formatters = {c: (lambda v, u=u: human_value(u, v))
                  for c in df.columns if (u := column_unit(c)) is not None
                  and pd.api.types.is_numeric_dtype(df[c].dtype)}
    max_rows = pd.get_option("display.max_rows")
    if max_rows and len(df) > max_rows:
        max_rows = pd.get_option("display.min_rows") or max_rows
    max_cols = pd.get_option("display.max_columns")
    table_id = f"jl-frame-{uuid.uuid4().hex[:12]}"
    table = pd.DataFrame(df).to_html(
        formatters=formatters, max_rows=max_rows, notebook=True, classes="jl-frame",
        max_cols=max_cols, table_id=table_id,
        show_dimensions=pd.get_option("display.show_dimensions"))
    return f"{FRAME_STYLE}<style>{_nowrap_css(df, table_id, max_cols)}</style>{table}"
