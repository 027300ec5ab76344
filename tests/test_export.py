"""jl.export_figure: static SVG/PNG of the collapsed DAG and the memory plots.

The SVG is checked against references outside the writer: the model's own
module tree (``named_modules``) for the group labels, the graph's edges
regrouped here by hand for the edge count, the plotly figure's traces for
the memory plot, and a real browser's text measurements (headless Chromium)
for "every label fits its box, nothing is clipped".
"""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ET

import pytest

import jointlab as jl
from jointlab import meta as _meta
from jointlab.errors import ExportError
from jointlab.models import lm_inputs, lm_train_fn, make_gpt2
from jointlab.viz import export as export_mod
from tests.chromium import browser, chromium_path

NS = {"s": "http://www.w3.org/2000/svg"}


@pytest.fixture(scope="module")
def lm():
    model, inputs = make_gpt2(n_layer=2, d=64, seq=16), lm_inputs(2, 1024, 16)
    return model, inputs, jl.trace(model, lm_train_fn, inputs)


def _groups(root: ET.Element) -> list[tuple[str, str]]:
    """(data-name, bold label) of every group box."""
    return [(g.get("data-name"), g.find("s:text[@class='label']", NS).text)
            for g in root.iterfind(".//s:g[@class='group']", NS)]


def _expected_labels(model, depth: int) -> set[str]:
    """Module-tree names cut to ``depth`` components, without an ancestor of a kept name."""
    cut = {".".join(n.split(".")[:depth]) for n, _ in model.named_modules() if n}
    return {c for c in cut if not any(o.startswith(c + ".") for o in cut)}


def _group_key(node, depth: int) -> tuple[str, bool]:
    m = _meta.info(node)
    if m.get("phase") == "output":
        return ("(output)", True)
    mod = m.get("module", "")
    return (".".join(mod.split(".")[:depth]) or "(root)", m.get("phase") in ("backward",))


def test_dag_svg_labels_every_module_group_and_every_collapsed_edge(lm, tmp_path):
    model, _, joint = lm
    path = jl.export_figure(joint, tmp_path / "dag.svg", depth=2)
    root = ET.parse(path).getroot()
    groups = _groups(root)
    fwd = {label for name, label in groups if name.startswith("fwd:")}
    bwd = {label for name, label in groups if name.startswith("bwd:")}
    modules = _expected_labels(model, 2)
    assert modules == {"wte", "wpe", "drop", "h.0", "h.1", "ln_f", "lm_head"}
    assert fwd == modules | {"(root)", _meta.TRAIN_FN}
    assert bwd == modules | {"(root)", _meta.TRAIN_FN, "(output)"}
    for name, label in groups:  # the label is the group's module (names unshortened here)
        assert name.split(":", 1)[1] == label
    pairs = set()
    for n in joint.graph.nodes:
        for a in n.all_input_nodes:
            s, d = _group_key(a, 2), _group_key(n, 2)
            if s != d:
                pairs.add((s, d))
    assert len(root.findall(".//s:path[@class='edge']", NS)) == len(pairs)


def test_auto_depth_is_the_deepest_level_within_the_group_budget(lm, tmp_path):
    model, _, joint = lm
    keys = {d: {_group_key(n, d) for n in joint.graph.nodes} for d in (1, 2, 3)}
    budget = len(keys[2])  # depth 3 needs more groups than this
    assert len(keys[3]) > budget
    root = ET.fromstring(export_mod.dag_svg_text(joint, max_groups=budget))
    assert len(_groups(root)) == len(keys[2])
    assert "(depth 2)" in root.find("s:text[@class='title']", NS).text
    one = ET.fromstring(export_mod.dag_svg_text(joint, max_groups=len(keys[2]) - 1))
    assert len(_groups(one)) == len(keys[1])


def test_plot_dag_figure_exports_as_drawn(lm, tmp_path):
    _, _, joint = lm
    fig = jl.plot_dag(joint, depth=3)
    root = ET.parse(jl.export_figure(fig, tmp_path / "fig.svg")).getroot()
    assert [n for n, _ in _groups(root)] == list(fig._jointlab_data.names)


def test_memory_svg_draws_the_figure_traces(lm, tmp_path):
    _, _, joint = lm
    prof = joint.memory()
    fig = jl.plot_memory(prof)
    root = ET.parse(jl.export_figure(prof, tmp_path / "mem.svg")).getroot()
    stacked = [t for t in fig.data if t.stackgroup]
    assert len(root.findall(".//s:polygon[@class='area']", NS)) == len(stacked) > 0
    legend = [t.text for t in root.iterfind(".//s:text[@class='legend']", NS)]
    assert legend == [t.name for t in fig.data if t.showlegend is not False]
    labels = [t.text for t in root.iterfind(".//s:text[@class='point-label']", NS)]
    peak = [a.text for a in fig.layout.annotations if a.yref in ("y", None)]
    assert labels == peak and prof.peak_node in labels[0]
    life = jl.plot_lifetimes(prof, top=10)
    root = ET.parse(jl.export_figure(life, tmp_path / "life.svg")).getroot()
    assert len(root.findall(".//s:rect[@class='bar']", NS)) == sum(len(t.y) for t in life.data)


def test_labels_fit_their_boxes_in_a_real_browser(lm, tmp_path):
    _, _, joint = lm
    path = jl.export_figure(joint, tmp_path / "dag.svg", depth=3)
    with browser() as b:
        page = b.new_page()
        page.goto(path.as_uri())
        bad = page.evaluate("""() => {
          const svg = document.querySelector('svg'), W = +svg.getAttribute('width'),
                H = +svg.getAttribute('height'), out = [];
          for (const g of document.querySelectorAll('g.group')) {
            const r = g.querySelector('rect').getBBox();
            for (const t of g.querySelectorAll('text')) {
              const b = t.getBBox();
              if (b.x < r.x || b.x + b.width > r.x + r.width || b.y < r.y ||
                  b.y + b.height > r.y + r.height) out.push(t.textContent);
            }
            if (r.x < 0 || r.y < 0 || r.x + r.width > W || r.y + r.height > H)
              out.push('box ' + g.dataset.name);
          }
          return [out, document.querySelectorAll('g.group').length];
        }""")
    assert bad[0] == [] and bad[1] > 20


def test_png_through_headless_chromium(lm, tmp_path):
    chromium_path()  # skips, with the reason, only where no Chromium is installed
    _, _, joint = lm
    svg = ET.fromstring(export_mod.dag_svg_text(joint))
    png = jl.export_figure(joint, tmp_path / "dag.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", png[16:24])
    assert (w, h) == (int(svg.get("width")), int(svg.get("height")))


def test_refusals(lm, tmp_path, monkeypatch):
    _, _, joint = lm
    with pytest.raises(ExportError, match=r"\.svg or \.png"):
        jl.export_figure(joint, tmp_path / "dag.pdf")
    with pytest.raises(ExportError, match="cannot export a dict"):
        jl.export_figure({}, tmp_path / "x.svg")
    with pytest.raises(ExportError, match="depth"):
        jl.export_figure(joint, tmp_path / "x.svg", depth=0)
    monkeypatch.setattr(export_mod, "find_chromium", lambda: None)
    with pytest.raises(ExportError, match="needs the system Chromium"):
        jl.export_figure(joint, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_plot_dag_of_every_node_exports_one_labelled_box_per_node(tmp_path):
    from tests.fixtures import zoo

    f = zoo.FIXTURES["tiny_lm"]
    joint = jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))
    fig = jl.plot_dag(joint)  # depth=None: every graph node, ungrouped
    root = ET.parse(jl.export_figure(fig, tmp_path / "nodes.svg")).getroot()
    nodes = {n.name: n for n in joint.graph.nodes}
    got = _groups(root)
    assert [n for n, _ in got] == list(fig._jointlab_data.names)
    for name, label in got:  # parameters by FQN, inputs by path, others by FX name
        m = jl.meta.info(nodes[name])
        want = m.get("fqn") or m.get("input_path") or name
        assert label == export_mod._svg.short(want), (name, label)
