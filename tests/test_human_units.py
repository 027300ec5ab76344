"""Human units in jointlab's notebook tables: ``joint.nodes``, ``joint.summary()``, joins.

The DataFrames keep raw numbers; their ``_repr_html_`` shows bytes, FLOPs and
times in human units, and no cell wraps. Expected strings are worked out by
hand from the layer sizes (a 768×1024 float32 weight is 3 MiB; its forward
``addmm`` on a 256-row batch is 2·256·1024·768 FLOPs), and every formatted cell
is parsed back and compared with the raw number beside it.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.units import column_unit, human_seconds

_SCALE = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "FLOP": 1, "kFLOP": 1e3,
          "MFLOP": 1e6, "GFLOP": 1e9, "TFLOP": 1e12, "s": 1, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}


class _Table(HTMLParser):
    """Header names and body cells (text) of the first table in some HTML."""

    def __init__(self) -> None:
        super().__init__()
        self.head: list[list[str]] = []
        self.rows: list[list[str]] = []
        self._in: str | None = None
        self._cell: list[str] = []
        self._section = ""

    def handle_starttag(self, tag, attrs):
        if tag in ("thead", "tbody"):
            self._section = tag
        elif tag == "tr":
            (self.rows if self._section == "tbody" else self.head).append([])
        elif tag in ("td", "th"):
            self._in, self._cell = tag, []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._in:
            text = "".join(self._cell).strip()
            (self.rows if self._section == "tbody" else self.head)[-1].append(text)
            self._in = None

    def handle_data(self, data):
        if self._in:
            self._cell.append(data)


def _parse(html_text: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    p = _Table()
    p.feed(html_text)
    cols = p.head[0][1:]  # the first header cell is above the index
    return cols, {r[0]: dict(zip(cols, r[1:])) for r in p.rows if r}


def _number(text: str) -> float:
    m = re.fullmatch(r"(-?[\d.]+) ?([a-zA-Zµ]*)", text)
    assert m, f"not a human number: {text!r}"
    return float(m.group(1)) * _SCALE.get(m.group(2), 1 if not m.group(2) else float("nan"))


@pytest.fixture(scope="module")
def joint():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 768), nn.GELU(), nn.Linear(768, 2))
    inputs = {"x": torch.randn(256, 1024), "y": torch.randn(256, 2)}
    return jl.trace(model, lambda m, x, y: F.mse_loss(m(x), y), inputs)


def test_node_table_shows_bytes_and_flops_in_human_units(joint):
    nodes = joint.nodes
    assert nodes["bytes"].dtype == "int64" and nodes["flops"].dtype == "int64"  # raw kept
    is_w = nodes["shape"].map(lambda s: tuple(s or ()) == (768, 1024))
    weight = nodes.index[(nodes.phase == "param") & is_w][0]
    mm = nodes.index[(nodes.phase == "forward") & nodes.target.str.contains("addmm")][0]
    cols, cells = _parse(nodes[["phase", "bytes", "flops", "numel"]]._repr_html_())
    assert cols == ["phase", "bytes", "flops", "numel"]
    assert cells[weight]["bytes"] == "3 MiB"  # 768 * 1024 * 4 B = 3 * 2**20
    assert cells[weight]["flops"] == "0"
    assert cells[mm]["flops"] == "403 MFLOP"  # 2 * 256 * 1024 * 768 = 402,653,184
    assert cells[mm]["numel"] == str(256 * 768)  # a count, not a unit
    for name, row in cells.items():
        for col in ("bytes", "flops"):
            raw = int(nodes.loc[name, col])
            assert _number(row[col]) == pytest.approx(raw, rel=5e-3, abs=0.5), (name, col)


def test_summaries_show_human_units(joint):
    by_phase = joint.summary(by="phase")
    _, cells = _parse(by_phase._repr_html_())
    assert set(cells) == set(by_phase.index)
    for phase, row in cells.items():
        for col in ("flops", "bytes", "saved_bytes"):
            assert re.search(r"[A-Za-z]", row[col]) or row[col] == "0", (phase, col, row[col])
            assert _number(row[col]) == pytest.approx(by_phase.loc[phase, col], rel=5e-3)
        assert row["nodes"] == str(by_phase.loc[phase, "nodes"])  # a count stays a count
    by_op = joint.summary(by="op")
    _, cells = _parse(by_op._repr_html_())
    assert cells["aten.addmm"]["flops_fwd"] == "403 MFLOP"  # 402,653,184 + 2*256*768*2
    by_module = joint.summary(by="module")
    _, cells = _parse(by_module._repr_html_())
    assert cells["0"]["flops_fwd"] == "403 MFLOP"
    assert cells["0"]["saved_bytes"].endswith("iB")


def test_joined_timings_show_seconds_and_the_frame_keeps_floats(joint):
    timed = joint.nodes[["phase"]].join(
        pd.DataFrame({"time_s": 2.5e-5, "mean": -7.275958e-12}, index=joint.nodes.index[:3]),
        how="inner")
    assert timed["time_s"].dtype == float
    _, cells = _parse(timed._repr_html_())
    assert [r["time_s"] for r in cells.values()] == ["25 µs"] * 3
    assert human_seconds(2.5) == "2.5 s" and human_seconds(0.0123) == "12.3 ms"
    assert column_unit("flops_unknown") is None and column_unit("step_mem_peak") == "bytes"


def test_no_number_wraps_in_a_narrow_browser(joint, tmp_path):
    """Chromium lays out a record-style table in a 240 px column: numbers and shapes stay whole."""
    from tests.chromium import browser, save_screenshot

    frame = joint.nodes[["phase", "bytes", "flops"]].join(pd.DataFrame(
        {"mean": -7.275958e-12, "std": 1.234567e-05, "time_s": 3.2e-6,
         "shape_of": [(2, 16, 128)] * len(joint.nodes),
         "gradient_of": "output of h.1, h.1.mlp, h.1.mlp.3"},
        index=joint.nodes.index), how="inner").head(6)
    page_html = (f"<html><body style='font:13px sans-serif'><div id=w style='width:240px'>"
                 f"{frame._repr_html_()}</div></body></html>")
    with browser() as b:
        page = b.new_page(viewport={"width": 400, "height": 600})
        page.set_content(page_html)
        lines = page.evaluate("""() => [...document.querySelectorAll('td')].map(td => {
            const r = document.createRange(); r.selectNodeContents(td);
            const tops = new Set([...r.getClientRects()].map(q => Math.round(q.top)));
            return [td.textContent, tops.size]; })""")
        save_screenshot(page, tmp_path, "human_units_narrow_table")
    assert lines and any("e-12" in t for t, _ in lines)
    wrapped = [(t, n) for t, n in lines if n > 1]
    assert wrapped and all(t.startswith("output of") for t, _ in wrapped)  # text may wrap
    assert all(n == 1 for t, n in lines if not t.startswith("output of"))  # numbers, shapes not
