"""The styled module-summary table: every figure of jl.module_summary, in human units.

Each cell is parsed back to a number here and compared with the DataFrame
it formats (3 significant digits), so a wrong unit or column shows.
"""

from __future__ import annotations

import math
import re
from html.parser import HTMLParser

import pytest

import jointlab as jl
from jointlab.analysis.modules import ModuleTable
from jointlab.models import lm_inputs, lm_train_fn, make_gpt2
from jointlab.viz.module_table import COLUMNS, module_summary_html

_SCALE = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "B": 1, "KiB": 2**10, "MiB": 2**20,
          "GiB": 2**30, "s": 1, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}


_UNIT = {"count": r"[\d.]+( [kMGT])?", "flops": r"0|[\d.]+ [kMGT]?FLOP",
         "bytes": r"[\d.]+ (B|KiB|MiB|GiB)", "time": r"[\d.]+ (s|ms|µs|ns)"}


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[tuple[str, dict]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell, self._attrs = [], dict(attrs)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append(("".join(self._cell).strip(), self._attrs))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _number(text: str) -> float:
    m = re.fullmatch(r"(-?[\d.]+) ?(k|M|G|T|KiB|MiB|GiB|B|s|ms|µs|ns)?(FLOP)?", text)
    assert m, text
    return float(m.group(1)) * _SCALE[m.group(2) or ""]


@pytest.fixture(scope="module")
def summary():
    model, inputs = make_gpt2(n_layer=2, d=64, seq=16), lm_inputs(2, 1024, 16)
    joint = jl.trace(model, lm_train_fn, inputs)
    return jl.module_summary(joint, model, inputs, record=jl.record(joint, model, inputs),
                             depth=2)


def test_every_cell_is_its_frame_value_in_human_units(summary):
    p = _Cells()
    p.feed(module_summary_html(summary))
    head, *rows = p.rows
    assert [h for h, _ in head] == ["module", *(h for h, _, _ in COLUMNS)]
    assert len(rows) == len(summary)
    for (name, row), cells in zip(summary.iterrows(), rows):
        assert cells[0][1]["title"] == name
        for (_, col, kind), (text, _) in zip(COLUMNS, cells[1:]):
            want = row[col]
            if kind == "shapes":
                assert text == ("—" if want is None else
                                ", ".join("×".join(map(str, s)) for s in want)), (name, col)
            else:
                assert re.fullmatch(_UNIT[kind], text), (name, col, text)
                got = _number(text)
                assert math.isclose(got, want, rel_tol=5e-3, abs_tol=1e-12), (name, col, text)
    tied = {name: cells[0][0] for name, cells in zip(summary.index, rows)}
    assert "tied: weight=lm_head.weight" in tied["wte"]
    assert "tied: weight=wte.weight" in tied["lm_head"]
    h0 = rows[list(summary.index).index("h.0")]
    share = 100 * summary.at["h.0", "flops_fwd"] / summary.at["", "flops_fwd"]
    assert h0[5][1]["title"] == f"{share:.1f}% of the model"


def test_no_record_and_escaping(summary):
    df = summary.copy()
    df[["time_fwd_s", "time_bwd_s"]] = math.nan
    df.index = ["<b>" + n if n else n for n in df.index]
    page = ModuleTable(df)._repr_html_()
    assert "<b>" not in page and "&lt;b&gt;wte" in page
    p = _Cells()
    p.feed(page)
    assert all(cells[-1][0] == "—" and cells[-2][0] == "—" for cells in p.rows[1:])
    assert "more modules" in module_summary_html(df, max_rows=3)
