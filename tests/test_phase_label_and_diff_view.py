"""One phase label for a fused kernel in both tables; jl.diff_view (issue 41, item 10).

``compiled.kernels()`` labelled a kernel covering forward and backward nodes
"backward+forward" (sorted names) and ``Stepper.kernel_timings()`` "forward+backward"
(graph order). Both now read :func:`jointlab.analysis.kernels.phase_label`. The
tables are built here from one traced graph's real nodes with the kernel map
stubbed (no Inductor compile): a kernel covering a backward and a forward node.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import jointlab as jl
from jointlab import meta
from jointlab.analysis import kernels
from jointlab.analysis.step import kernel_timing


def _fwd_bwd():
    torch.manual_seed(0)
    joint = jl.trace(nn.Linear(4, 2), lambda m, x: m(x).square().sum(), {"x": torch.randn(3, 4)})
    fwd = next(n for n in joint.graph.nodes if meta.phase(n) == "forward")
    bwd = next(n for n in joint.graph.nodes if meta.phase(n) == "backward")
    return joint, fwd, bwd


def test_phase_label_names_forward_first():
    joint, fwd, bwd = _fwd_bwd()
    assert kernels.phase_label([bwd, fwd]) == "forward+backward"
    assert kernels.phase_label([fwd, bwd]) == "forward+backward"
    assert kernels.phase_label([bwd, bwd]) == "backward"
    assert kernels.phase_label([]) == ""


def test_kernel_table_and_kernel_timings_label_a_fused_kernel_alike(monkeypatch):
    joint, fwd, bwd = _fwd_bwd()
    kernel = "cpp_fused_0:1"
    monkeypatch.setattr(kernels, "kernel_map", lambda c: {kernel: [fwd.name, bwd.name]})
    monkeypatch.setattr(kernels, "kernel_copies", lambda c: {})
    monkeypatch.setattr(kernels, "copied_values", lambda c: {})
    monkeypatch.setattr(kernels, "kernel_coverage", lambda c: None)
    monkeypatch.setattr(kernel_timing, "kernel_copies", lambda c: {})
    compiled = SimpleNamespace(source=joint, compiled=SimpleNamespace(source_code=""))
    table = kernels.kernel_table(compiled)
    stepper = SimpleNamespace(  # kernel_info in covers' order, as the stepper gave it
        joint=joint, compiled=compiled, timings={kernel: 1e-3},
        covers={kernel: (bwd.name, fwd.name)},
        kernel_info=lambda k: {"modules": ("",), "phase": "backward+forward"})
    timings = kernel_timing.kernel_timings(stepper)
    assert table.loc[kernel, "phase"] == timings.loc[kernel, "phase"] == "forward+backward"


def test_diff_view_is_exported_lazily():
    from jointlab.viz.diff import diff_view

    assert "diff_view" in jl.__all__ and "diff_view" in dir(jl)
    assert jl.diff_view is diff_view
    from jointlab import diff_view as again

    assert again is diff_view


def test_a_diff_exports_as_svg_png_and_html(tmp_path):
    import xml.etree.ElementTree as ET

    from jointlab.viz.diff import DIFF_COLORS
    from jointlab.viz.export import find_chromium
    from tests.test_diff import _forward, _trace, bf16_roundtrip, drop_detach

    model, inputs, a = _trace()
    _, _, b = _trace()
    drop_detach(b)
    bf16_roundtrip(b, _forward(b, torch.ops.aten.addmm.default, "fc1"))
    d = jl.diff(a, b)
    view = jl.diff_view(a, b, d)
    svg = view.export(tmp_path / "diff.svg", depth=None)  # every node drawn
    stroke = {}
    for g in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}g"):
        rect = g.find("{http://www.w3.org/2000/svg}rect")
        if g.get("class") == "group" and rect is not None:
            stroke[g.get("data-name")] = rect.get("stroke")
    # independent reference: the diff's own tables, not the view's layer
    added, changed = set(d.added["node_b"]), set(d.changed["node_b"])
    assert added and changed and set(stroke) == {n.name for n in b.graph.nodes}
    assert {n for n, c in stroke.items() if c == DIFF_COLORS["added"]} == added
    assert {n for n, c in stroke.items() if c == DIFF_COLORS["changed"]} == changed
    assert all(c == "#dddddd" for n, c in stroke.items() if n not in added | changed)
    text = svg.read_text()
    assert f"+{len(added)} added" in text and ">same</text>" in text
    page = view.export(tmp_path / "diff.html")
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "jointlabDag" in html
    assert f"+{len(added)} added" in html
    assert find_chromium() is not None, "the PNG export needs the system Chromium"
    png = view.export(tmp_path / "diff.png")  # depth="auto": module boxes take the change
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    with pytest.raises(jl.errors.ExportError, match=r"\.svg, \.png or \.html"):
        view.export(tmp_path / "diff.pdf")
