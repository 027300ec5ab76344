"""jl.export_figure: static SVG/PNG of the DAG (the view's engine, laid out to a page) and memory.

The SVG is checked against references outside the writer: the model's own
module tree (``named_children``) for the box labels, the graph's edges
regrouped here by hand for the edge count, the plotly figure's traces for the
memory plot, ``_style.module_colors`` recomputed from the graph for the
colours, and a real browser's layout (headless Chromium: ``getBBox`` of every
label) for "every label fits its box, inside the page, nothing clipped".
"""

from __future__ import annotations

import math
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import torch

import jointlab as jl
from jointlab import meta as _meta
from jointlab.errors import ExportError
from jointlab.models import lm_inputs, lm_train_fn, make_gpt2
from jointlab.viz import _style
from jointlab.viz import export as export_mod
from tests.chromium import browser, chromium_path
from tests.fixtures.convnext import ConvNeXt, convnext_inputs, convnext_train_fn

NS = {"s": "http://www.w3.org/2000/svg"}


@pytest.fixture(scope="module")
def lm():
    model, inputs = make_gpt2(n_layer=2, d=64, seq=16), lm_inputs(2, 1024, 16)
    return model, inputs, jl.trace(model, lm_train_fn, inputs)


@pytest.fixture(scope="module")
def convnext():
    torch.manual_seed(0)
    return jl.trace(ConvNeXt(), convnext_train_fn, convnext_inputs())


def _groups(root: ET.Element) -> list[tuple[str, str]]:
    """(data-name, bold label) of every box."""
    return [(g.get("data-name"), g.find("s:text[@class='label']", NS).text)
            for g in root.iterfind(".//s:g[@class='group']", NS)]


def _view_box(root: ET.Element) -> tuple[float, float]:
    x0, y0, w, h = map(float, root.get("viewBox").split())
    assert (x0, y0) == (0, 0)
    return w, h


def _item_key(node, top: set[str]) -> tuple[str, bool]:
    """The item a node is drawn as with only the root open: its top-level module's box
    (per band), or itself when its module is the root."""
    m = _meta.info(node)
    first = (m.get("module") or "").split(".")[0]
    bwd = m.get("phase") in ("backward", "output")
    return (("bwd:" if bwd else "fwd:") + first, bwd) if first in top else (node.name, bwd)


def _plumbing(joint) -> set[str]:
    """Nodes the export folds into its edges when open: views (getitem included), detach and
    alias, and ops that read no placeholder (constants such as a mask's arange)."""
    const, out = {}, set()
    for n in joint.graph.nodes:
        m = _meta.info(n)
        const[n] = n.op == "call_function" and all(const[a] for a in n.all_input_nodes)
        if n.op == "call_function" and (const[n] or m.get("category") == "view"
                                         or _meta.op_name(n) in ("detach", "alias")):
            out.add(n.name)
    return out


def test_depth_1_draws_the_root_nodes_and_one_box_per_top_module_and_band(lm, tmp_path):
    """Root nodes (plumbing folded: an edge through it joins what feeds it to what reads
    it) and one box per top module and band; the subtitle counts what was folded."""
    model, _, joint = lm
    root = ET.parse(jl.export_figure(joint, tmp_path / "dag.svg", depth=1)).getroot()
    top = {n for n, _ in model.named_children()} | {_meta.TRAIN_FN}
    fold = {n.name for n in joint.graph.nodes if n.name in _plumbing(joint)
            and _item_key(n, top)[0] == n.name}  # open at depth 1: the root's own
    assert fold  # the lm's loss reads views of the logits
    keys = {_item_key(n, top)[0] for n in joint.graph.nodes if n.name not in fold}
    groups = _groups(root)
    assert sorted(name for name, _ in groups) == sorted(keys)
    boxes = {name for name in keys if name[:4] in ("fwd:", "bwd:")}
    assert {b[4:] for b in boxes if b.startswith("fwd:")} == top  # every module, named
    for name, label in groups:
        if name in boxes:  # a box is labelled with its module, a node with its name
            assert label == name[4:]
    feeds: dict[str, set[str]] = {}  # per node, the drawn items its value comes from
    pairs = set()
    for n in joint.graph.nodes:
        srcs = set().union(*(feeds[a.name] for a in n.all_input_nodes))
        key = _item_key(n, top)[0]
        feeds[n.name] = srcs if n.name in fold else {key}
        if n.name not in fold:
            pairs |= {(s, key) for s in srcs if s != key}
    edges = [p for cls in ("edge", "edge-cut", "edge-route")
             for p in root.findall(f".//s:path[@class='{cls}']", NS)]
    assert len(edges) == len(pairs)
    sub = "".join(root.find(".//s:text[@class='subtitle']", NS).itertext())
    assert f"{len(fold)} plumbing ops" in sub, sub


def test_subtitle_counts_the_phases_as_the_card_does(lm, tmp_path):
    """The header said forward 13 / backward 19 where the card said 7 / 18 (it counted
    drawn items, params and the output included): it counts the card's ops now."""
    _, _, joint = lm
    root = ET.parse(jl.export_figure(joint, tmp_path / "dag.svg", depth=1)).getroot()
    sub = "".join(root.find(".//s:text[@class='subtitle']", NS).itertext())
    phases = joint.nodes["phase"].value_counts()
    assert f"forward ({phases['forward']} ops)" in sub, sub
    assert f"backward ({phases['backward']} ops)" in sub, sub
    assert f"forward={phases['forward']}" in repr(joint) and f"backward={phases['backward']}" \
        in repr(joint)


def test_auto_depth_opens_whole_levels_while_the_drawn_items_fit_the_budget(lm):
    """At least the levels dag_view opens for the same budget (plumbing folded, more fit),
    and never more items drawn than the budget."""
    _, _, joint = lm
    for budget in (20, 60, 400):
        view = jl.dag_view(joint, budget=budget).payload
        names, parent = view["groups"]["name"], view["groups"]["parent"]
        shown = {names[g] for g in view["expanded"]}
        root = ET.fromstring(export_mod.dag_svg_text(joint, max_groups=budget))
        items = _groups(root)
        drawn = {name[4:] for name, _ in items if name[:4] in ("fwd:", "bwd:")}
        # no box for a group dag_view shows open; a box's parent is open
        assert not drawn & {n or "(root)" for n in shown}, budget
        assert all(names[parent[names.index(d)]] not in drawn for d in drawn), budget
        assert len(items) <= budget, (budget, len(items))


@pytest.mark.parametrize("aspect", [1.414, 0.707, 2.0])
def test_page_meets_the_aspect_by_wrapping_rows_not_only_by_padding(convnext, aspect):
    root = ET.fromstring(export_mod.dag_svg_text(convnext, aspect=aspect))
    w, h = _view_box(root)
    assert abs(w / h - aspect) / aspect < 0.01
    rects = [r for g in root.iterfind(".//s:g[@class='group']", NS)
             for r in g.iterfind("s:rect", NS)]
    x0 = min(float(r.get("x")) for r in rects)
    x1 = max(float(r.get("x")) + float(r.get("width")) for r in rects)
    y0 = min(float(r.get("y")) for r in rects)
    y1 = max(float(r.get("y")) + float(r.get("height")) for r in rects)
    rows = {g.get("data-row") for g in root.iterfind(".//s:g[@class='group']", NS)}
    single = ET.fromstring(export_mod.dag_svg_text(convnext, aspect=None, width=1e9))
    sw, sh = _view_box(single)
    assert sw / sh > 4  # one row is a strip: the wrapping below is what meets the aspect
    assert len(rows) > 1
    assert abs(math.log(((x1 - x0) / (y1 - y0)) / aspect)) < math.log(2.0)


def test_width_target_is_met_with_the_fewest_rows(convnext):
    wide = ET.fromstring(export_mod.dag_svg_text(convnext, aspect=None, width=1e9))
    natural, _ = _view_box(wide)
    for target in (1500, 2500):
        root = ET.fromstring(export_mod.dag_svg_text(convnext, aspect=None, width=target))
        w, _ = _view_box(root)
        assert w <= target < natural


def test_side_by_side_puts_each_rows_backward_right_of_its_forward(convnext):
    root = ET.fromstring(export_mod.dag_svg_text(convnext, arrange="side"))
    rows: dict[str, dict[str, list[float]]] = {}
    for g in root.iterfind(".//s:g[@class='group']", NS):
        r = g.find("s:rect", NS)
        x0, x1 = float(r.get("x")), float(r.get("x")) + float(r.get("width"))
        band = rows.setdefault(g.get("data-row"), {"forward": [], "backward": []})
        band[g.get("data-band")] += [x0, x1]
    both = [b for b in rows.values() if b["forward"] and b["backward"]]
    assert len(both) >= 3
    assert all(min(b["backward"]) > max(b["forward"]) for b in both)
    stacked = ET.fromstring(export_mod.dag_svg_text(convnext, arrange="stacked"))
    for g in stacked.iterfind(".//s:g[@class='group']", NS):
        assert g.get("data-band") in ("forward", "backward")


def test_colours_are_the_style_module_colours_in_graph_order(lm, tmp_path):
    _, _, joint = lm
    prefixes = [""]
    for n in joint.graph.nodes:
        parts = (_meta.info(n).get("module") or "").split(".")
        prefixes += [".".join(parts[:k]) for k in range(1, len(parts) + 1) if parts[0]]
    want = _style.module_colors(prefixes)
    root = ET.parse(jl.export_figure(joint, tmp_path / "all.svg", depth=None)).getroot()
    nodes = {n.name: n for n in joint.graph.nodes}
    for g in root.iterfind(".//s:g[@class='group']", NS):
        mod = _meta.info(nodes[g.get("data-name")]).get("module") or ""
        assert g.find("s:rect", NS).get("stroke") == want[mod], g.get("data-name")


def test_legend_is_bounded_and_below_the_drawing(tmp_path):
    model, inputs = make_gpt2(n_layer=6, d=32, seq=8), lm_inputs(2, 1024, 8)
    joint = jl.trace(model, lm_train_fn, inputs)
    root = ET.parse(jl.export_figure(joint, tmp_path / "g.svg", depth=None)).getroot()
    mods = {_meta.info(n).get("module") or "(root)" for n in joint.graph.nodes}
    entries = root.findall(".//s:g[@class='legend-entry']", NS)
    assert len(mods) > 13 and len(entries) == 13  # 12 colours and "+N more"
    more = entries[-1]
    assert more.find("s:text", NS).text == f"+{len(mods) - 12} more"
    listed = {e.find("s:title", NS).text for e in entries[:-1]}
    rest = set(more.find("s:title", NS).text.split(", "))
    assert listed | rest == mods and not listed & rest
    assert all(len(e.find("s:text", NS).text) <= 32 for e in entries)
    w, h = _view_box(root)
    boxes = [float(r.get("y")) + float(r.get("height"))
             for g in root.iterfind(".//s:g[@class='group']", NS) for r in g.iterfind("s:rect", NS)]
    ys = [float(t.get("y")) for e in entries for t in e.iterfind("s:text", NS)]
    assert min(ys) > max(boxes) and max(ys) < h


def _browser_check(page) -> list:
    return page.evaluate("""() => {
      const svg = document.querySelector('svg'), vb = svg.viewBox.baseVal, out = [];
      const inside = b => b.x >= vb.x && b.y >= vb.y && b.x + b.width <= vb.x + vb.width &&
                          b.y + b.height <= vb.y + vb.height;
      for (const g of document.querySelectorAll('g.group')) {
        const r = g.querySelector('rect').getBBox();
        for (const t of g.querySelectorAll('text')) {
          const b = t.getBBox();
          if (!t.textContent) out.push('empty label ' + g.dataset.name);
          if (b.x < r.x || b.x + b.width > r.x + r.width || b.y < r.y ||
              b.y + b.height > r.y + r.height) out.push(t.textContent);
        }
        if (!inside(r)) out.push('box ' + g.dataset.name);
      }
      for (const t of document.querySelectorAll('text'))
        if (!inside(t.getBBox())) out.push('outside ' + t.textContent);
      const box = svg.getBoundingClientRect();
      return [out, document.querySelectorAll('g.group').length, box.width,
              document.documentElement.scrollWidth];
    }""")


@pytest.mark.parametrize("which", ["lm", "convnext"])
@pytest.mark.parametrize("depth", ["auto", None])
def test_labels_fit_their_boxes_inside_the_page_in_a_real_browser(which, depth, request,
                                                                  tmp_path):
    joint = request.getfixturevalue(which)
    joint = joint[2] if isinstance(joint, tuple) else joint
    path = jl.export_figure(joint, tmp_path / "dag.svg", depth=depth)
    root = ET.parse(path).getroot()
    nodes = {n.name for n in joint.graph.nodes}
    w, h = (int(float(root.get(k))) for k in ("data-width", "data-height"))
    with browser() as b:
        page = b.new_page(viewport={"width": w, "height": h})  # at its own size
        page.goto(path.as_uri())
        bad, count, _, _ = _browser_check(page)
        # inline in a notebook-like cell 700 px wide: scaled to it, never clipped
        page = b.new_page(viewport={"width": 900, "height": 700})
        page.set_content(f'<div style="width:700px">{path.read_text(encoding="utf-8")}</div>')
        _, _, shown_w, scroll_w = _browser_check(page)
    assert bad == [] and count == len(_groups(root)) > 20
    assert 600 < shown_w <= 700 and scroll_w <= 900
    if depth is None:  # every node has its box and label
        assert {name for name, _ in _groups(root)} == nodes


def test_png_through_headless_chromium(lm, tmp_path):
    chromium_path()  # skips, with the reason, only where no Chromium is installed
    _, _, joint = lm
    svg = ET.fromstring(export_mod.dag_svg_text(joint))
    png = jl.export_figure(joint, tmp_path / "dag.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", png[16:24])
    assert (w, h) == (int(svg.get("data-width")), int(svg.get("data-height")))


NO_PLOTLY = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "plotly" or name.startswith("plotly."):
            raise ModuleNotFoundError("No module named 'plotly' (blocked)", name=name)
sys.meta_path.insert(0, Block())
import jointlab as jl
from jointlab.models import lm_inputs, lm_train_fn, make_gpt2
j = jl.trace(make_gpt2(n_layer=1, d=32, seq=8), lm_train_fn, lm_inputs(2, 1024, 8))
jl.export_figure(j, sys.argv[1])
jl.export_figure(j, sys.argv[1], depth=None, arrange="side")
print("PLOTLY", [m for m in sys.modules if m.split(".")[0] == "plotly"])
"""


def test_dag_export_works_without_plotly(tmp_path):
    """A base install has no plotly: the DAG export must not need it."""
    out = tmp_path / "g.svg"
    r = subprocess.run([sys.executable, "-c", NO_PLOTLY, str(out)], capture_output=True,
                       text=True, timeout=300, cwd=str(pathlib_root()))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "PLOTLY []" in r.stdout
    assert len(_groups(ET.parse(out).getroot())) > 20


def pathlib_root():
    import pathlib

    return pathlib.Path(__file__).resolve().parent.parent


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


def test_refusals(lm, tmp_path, monkeypatch):
    _, _, joint = lm
    with pytest.raises(ExportError, match=r"\.svg or \.png"):
        jl.export_figure(joint, tmp_path / "dag.pdf")
    with pytest.raises(ExportError, match="cannot export a dict"):
        jl.export_figure({}, tmp_path / "x.svg")
    with pytest.raises(ExportError, match="depth"):
        jl.export_figure(joint, tmp_path / "x.svg", depth=0)
    for kw, what in (({"arrange": "diagonal"}, "arrange"), ({"aspect": -1}, "aspect"),
                     ({"width": "wide"}, "width"), ({"color_by": "kernel"}, "color_by")):
        with pytest.raises(ExportError, match=what):
            jl.export_figure(joint, tmp_path / "x.svg", **kw)
    with pytest.raises(ExportError, match="not its dag_view"):
        jl.export_figure(jl.dag_view(joint), tmp_path / "x.svg")
    monkeypatch.setattr(export_mod, "find_chromium", lambda: None)
    with pytest.raises(ExportError, match="needs the system Chromium"):
        jl.export_figure(joint, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_every_node_exports_one_labelled_box(tmp_path):
    from tests.fixtures import zoo

    f = zoo.FIXTURES["tiny_lm"]
    joint = jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))
    root = ET.parse(jl.export_figure(joint, tmp_path / "nodes.svg", depth=None)).getroot()
    nodes = {n.name: n for n in joint.graph.nodes}
    got = _groups(root)
    assert sorted(n for n, _ in got) == sorted(nodes)
    for name, label in got:  # parameters by FQN, inputs by path, others by FX name
        m = jl.meta.info(nodes[name])
        want = m.get("fqn") or m.get("input_path") or name
        assert label == export_mod._svg.short(want), (name, label)


def _kernel_like_layer(joint) -> dict[str, str]:
    """~60 kernel names as Inductor spells them (some 150 characters), on the compute nodes."""
    ops = "add_native_layer_norm_native_layer_norm_backward_view_mul_sum_div_sub_pow_rsqrt"
    compute = [n.name for n in joint.graph.nodes if _meta.info(n).get("phase")
               in ("forward", "backward")]
    return {name: f"cpp_fused_{ops}_{ops[:k % 60]}_{k % 60}" for k, name in enumerate(compute)}


def test_kernel_layer_legend_is_bounded_like_the_views(lm, tmp_path):
    _, _, joint = lm
    layer = _kernel_like_layer(joint)
    labels = list(dict.fromkeys(layer.values()))
    assert len(labels) == 60 and max(map(len, labels)) > 140
    root = ET.parse(jl.export_figure(joint, tmp_path / "k.svg", depth=None,
                                     layers={"kernel": layer}, color_by="kernel")).getroot()
    entries = root.findall(".//s:g[@class='legend-entry']", NS)
    texts = [e.find("s:text", NS).text for e in entries]
    assert len(entries) == 12 + 3 and texts[12] == "+48 more" and texts[13:] == ["(mixed)",
                                                                                 "(none)"]
    assert all(len(t) <= 32 for t in texts)
    # the twelve with most nodes are listed (full names in their tooltips), the rest in "+48"
    from collections import Counter

    counts = Counter(layer.values())
    shown = [e.find("s:title", NS).text for e in entries[:12]]
    assert all(counts[s] >= counts[r] for s in shown for r in labels if r not in shown)
    assert set(entries[12].find("s:title", NS).text.split(", ")) == set(labels) - set(shown)
    # nodes of one kernel share a colour, the listed kernels' colours differ, no label: grey
    nodes = {n.name: n for n in joint.graph.nodes}
    stroke: dict[str, set] = {}
    for g in root.iterfind(".//s:g[@class='group']", NS):
        stroke.setdefault(layer.get(g.get("data-name"), ""), set()).add(
            g.find("s:rect", NS).get("stroke"))
    assert all(len(c) == 1 for c in stroke.values())
    assert len({next(iter(stroke[s])) for s in shown}) == 12
    assert stroke[""] == {"#dddddd"} and len(nodes) > len(layer)
    w, h = _view_box(root)
    boxes = [float(r.get("y")) + float(r.get("height"))
             for g in root.iterfind(".//s:g[@class='group']", NS) for r in g.iterfind("s:rect", NS)]
    ys = [float(t.get("y")) for e in entries for t in e.iterfind("s:text", NS)]
    assert min(ys) > max(boxes) and max(ys) < h  # below the drawing, on the page
    grouped = ET.fromstring(export_mod.dag_svg_text(joint, depth=1, layers={"kernel": layer},
                                                    color_by="kernel"))
    fills = {g.find("s:rect", NS).get("stroke")
             for g in grouped.iterfind(".//s:g[@class='group']", NS)
             if g.get("data-name").startswith(("fwd:", "bwd:"))}
    assert "#999999" in fills  # a module box whose nodes ran in several kernels: mixed
    with pytest.raises(ExportError, match="label layers only"):
        export_mod.dag_svg_text(joint, layers={"n": {"mm": 1.0}}, color_by="n")


def test_colours_are_the_views_colours(lm):
    """Every box and node has the colour dag_view's payload gives its module group."""
    _, _, joint = lm
    groups = jl.dag_view(joint).payload["groups"]
    if "color" not in groups:
        pytest.skip("this dag_view payload carries no module colours (the dagjs branch adds "
                    "groups['color']); test_colours_are_the_style_module_colours checks _style")
    want = {n or "(root)": _style.PALETTE[c] for n, c in zip(groups["name"], groups["color"])}
    nodes = {n.name: n for n in joint.graph.nodes}
    seen = 0
    for depth in (1, 2, None):
        root = ET.fromstring(export_mod.dag_svg_text(joint, depth=depth))
        for g in root.iterfind(".//s:g[@class='group']", NS):
            name = g.get("data-name")
            mod = name[4:] if name[:4] in ("fwd:", "bwd:") else \
                (_meta.info(nodes[name]).get("module") or "(root)")
            assert g.find("s:rect", NS).get("stroke") == want[mod], (depth, name)
            seen += 1
    assert seen > 300


# -- issue 43 item 8: real models at first export ---------------------------------------------
def test_falcon_exports_its_blocks_not_one_box_and_no_loss_plumbing(tmp_path):
    """Tiny HF Falcon, default export: boxes below ``transformer`` (its layers' attention and
    MLP), no open plumbing node drawn (the loss's getitem/detach were), the loss ops are."""
    from tests.fixtures.view_models import falcon_joint

    joint = falcon_joint()
    root = ET.parse(jl.export_figure(joint, tmp_path / "falcon.svg")).getroot()
    names = [name for name, _ in _groups(root)]
    boxes = {n[4:] for n in names if n[:4] in ("fwd:", "bwd:")}
    assert "transformer" not in boxes and {"transformer.h.0.self_attention",
                                           "transformer.h.1.mlp"} <= boxes, boxes
    assert not set(names) & _plumbing(joint), set(names) & _plumbing(joint)
    ops = {_meta.op_name(n) for n in joint.graph.nodes if n.name in names}
    assert {"_log_softmax", "nll_loss_forward", "nll_loss_backward"} <= ops, ops


def test_unet_skip_connection_is_an_edge_named_at_both_ends(tmp_path):
    """A U-Net's skip (the first block's output concatenated before the last decoder): the
    export draws an edge from the item holding the skip's source to the item holding the
    concat, and one that runs between rows names its other end beside each stub."""
    from tests.fixtures.view_models import unet_joint

    joint = unet_joint()
    root = ET.parse(jl.export_figure(joint, tmp_path / "unet.svg")).getroot()
    cat = [n for n in joint.graph.nodes if _meta.op_name(n) == "cat" and jl.meta.is_forward(n)]
    last = cat[-1]  # torch.cat([x1, up(y)]): x1 is inc's output
    skip = next(a for a in last.all_input_nodes if _meta.info(a).get("module", "").startswith(
        "inc"))
    members = {g.get("data-name"): g for g in root.iterfind(".//s:g[@class='group']", NS)}

    def item_of(node) -> str:
        if node.name in members:
            return node.name
        mod = _meta.info(node).get("module", "")
        return next(n for n in members if n[:4] == "fwd:" and (
            mod == n[4:] or mod.startswith(n[4:] + ".")))

    src, dst = item_of(skip), item_of(last)
    paths = [p for p in root.iter("{http://www.w3.org/2000/svg}path")
             if p.get("data-src") == src and p.get("data-dst") == dst]
    assert len(paths) == 1, (src, dst)
    if paths[0].get("class") == "edge-cut":
        ends = ["".join(t.itertext()) for t in root.iterfind(".//s:text[@class='edge-end']", NS)]
        assert any(e.startswith("→ " + dst[:10]) for e in ends), (dst, ends[:10])
        assert any(e.startswith(src.split(":")[-1][:10]) and e.endswith("→") for e in ends)


def test_sibling_and_nearby_modules_never_share_a_colour():
    """module_colors over a U-Net in graph order: siblings differ, a module differs from its
    parent, ``up`` differs from ``down.1`` (they shared one), the palette is used evenly."""
    from jointlab.viz._hierarchy import prefixes
    from tests.fixtures.view_models import unet_joint

    joint = unet_joint()
    mods = list(dict.fromkeys(jl.meta.module(n) for n in joint.graph.nodes))
    order = list(dict.fromkeys(["", *(p for m in mods for p in prefixes(m))]))
    colors = _style.module_colors(order)
    assert colors["up"] != colors["down.1"]
    for p in order:
        parent = p.rsplit(".", 1)[0] if "." in p else ""
        if p:
            assert colors[p] != colors[parent], p
        sibs = [q for q in order if q != p and q and (q.rsplit(".", 1)[0] if "." in q else "")
                == parent]
        assert colors[p] not in {colors[q] for q in sibs}, (p, sibs)
    # the colours are used evenly: none more than once more than the rarest
    counts = [list(colors.values()).count(c) for c in _style.PALETTE]
    assert max(counts) - min(counts) <= 1 + len(order) // len(_style.PALETTE), counts


def test_a_target_width_is_not_padded_to_the_default_aspect(convnext):
    """``width=1024`` alone (the default aspect left as is) gives a page at most that wide:
    padding it to 1.414 made a 4,286 px page of one narrow column for tiny HF Falcon."""
    root = ET.fromstring(export_mod.dag_svg_text(convnext, width=1024))
    w, h = _view_box(root)
    assert w <= 1024 + 1 and w / h < 1.414, (w, h)


# -- issue 43 item 8: edges between wrapped rows are drawn lines ------------------------------
def _points(d: str) -> list[list[tuple[float, float]]]:
    """Polylines of a path's ``d`` (absolute M/L, relative h, absolute H), one per M."""
    out: list[list[tuple[float, float]]] = []
    for tok in d.replace("M", " M").replace("L", " L").replace("H", " H").replace(
            "h", " h").split():
        cmd, arg = tok[0], tok[1:]
        if cmd in "ML":
            x, y = map(float, arg.split(","))
            if cmd == "M":
                out.append([])
            out[-1].append((x, y))
        else:
            x0, y0 = out[-1][-1]
            out[-1].append((float(arg) + (x0 if cmd == "h" else 0.0), y0))
    return out


def _hits(p: tuple[float, float], q: tuple[float, float],
          r: tuple[float, float, float, float]) -> bool:
    """True when segment p-q enters the open rectangle r = (x0, y0, x1, y1) (clipping)."""
    t0, t1 = 0.0, 1.0
    dx, dy = q[0] - p[0], q[1] - p[1]
    for den, num in ((-dx, p[0] - r[0]), (dx, r[2] - p[0]), (-dy, p[1] - r[1]),
                     (dy, r[3] - p[1])):
        if den == 0:
            if num <= 0:
                return False
        elif den < 0:
            t0 = max(t0, num / den)
        else:
            t1 = min(t1, num / den)
    return t1 - t0 > 1e-6


def _text_box(t: ET.Element) -> tuple[float, float, float, float]:
    """Approximate box of an SVG text from its position, anchor and font size."""
    fs = float(t.get("font-size", 12))
    text = "".join(s for s in [t.text or ""] + [c.tail or "" for c in t])
    w = len(text) * fs * (0.62 if t.get("font-weight") == "bold" else 0.55)
    x, y = float(t.get("x")), float(t.get("y"))
    x0 = {"middle": x - w / 2, "end": x - w}.get(t.get("text-anchor", "start"), x)
    return (x0, y - 0.78 * fs, x0 + w, y + 0.22 * fs)


def _on_edge(p: tuple[float, float], r: tuple[float, float, float, float]) -> bool:
    """True when point p lies on the rectangle's outline (1.5 px)."""
    inside = r[0] - 1.5 <= p[0] <= r[2] + 1.5 and r[1] - 1.5 <= p[1] <= r[3] + 1.5
    deep = r[0] + 1.5 < p[0] < r[2] - 1.5 and r[1] + 1.5 < p[1] < r[3] - 1.5
    return inside and not deep


def test_unet_edges_between_rows_are_lines_from_box_to_box_clear_of_labels(tmp_path):
    """Every edge between wrapped rows (regrouped here from the traced edges and the rows the
    SVG puts the boxes in) is one drawn line touching its two boxes, passing no other box;
    no line crosses a label outside a box (captions, names, legend), and a routed line none
    at all. The skip (inc -> cat_1) was two dashed stubs eleven rows apart."""
    from tests.fixtures.view_models import unet_joint

    joint = unet_joint()
    root = ET.parse(jl.export_figure(joint, tmp_path / "unet.svg", width=1024)).getroot()
    rect, row = {}, {}
    for g in root.iterfind(".//s:g[@class='group']", NS):
        r = g.find("s:rect", NS)
        x, y = float(r.get("x")), float(r.get("y"))
        rect[g.get("data-name")] = (x, y, x + float(r.get("width")), y + float(r.get("height")))
        row[g.get("data-name")] = g.get("data-row")
    assert len(set(row.values())) > 3  # wrapped

    def item_of(n) -> str | None:
        if n.name in rect:
            return n.name
        band = "bwd:" if _meta.info(n).get("phase") in ("backward", "output") else "fwd:"
        mod = _meta.info(n).get("module", "")
        boxes = [k for k in rect if k.startswith(band) and (mod == k[4:] or mod.startswith(
            k[4:] + "."))]
        return max(boxes, key=len) if boxes else None  # None: folded plumbing

    feeds: dict[str, set[str]] = {}
    pairs = set()
    for n in joint.graph.nodes:
        srcs = set().union(*(feeds[a.name] for a in n.all_input_nodes))
        key = item_of(n)
        feeds[n.name] = srcs if key is None else {key}
        pairs |= {(s, key) for s in srcs if key is not None and s != key}
    cross = {(s, d) for s, d in pairs if row[s] != row[d]}
    cat = [n for n in joint.graph.nodes if _meta.op_name(n) == "cat" and jl.meta.is_forward(n)]
    skip = next(a for a in cat[-1].all_input_nodes  # torch.cat([x1, up(y)]): x1 from inc
                if _meta.info(a).get("module", "").startswith("inc"))
    assert (item_of(skip), item_of(cat[-1])) in cross and len(cross) > 20, len(cross)
    lines = [(p, _points(p.get("d"))) for p in root.iter("{http://www.w3.org/2000/svg}path")
             if p.get("class", "").startswith("edge")]
    for s, d in cross:
        drawn = [pts[0] for p, pts in lines if len(pts) == 1 and _on_edge(pts[0][0], rect[s])
                 and _on_edge(pts[0][-1], rect[d])]
        assert drawn, (s, d)
        others = [r for k, r in rect.items() if k not in (s, d)]
        for a, b in zip(drawn[0], drawn[0][1:]):
            assert not any(_hits(a, b, r) for r in others), (s, d, a, b)
    # drawn over the lines: labels inside boxes, band captions on a white halo (an edge of a
    # row from a forward box down to the backward box under it passes under its caption)
    over = {id(t) for g in root.iterfind(".//s:g[@class='group']", NS) for t in g}
    captions = root.findall(".//s:text[@class='band']", NS)
    assert captions and all(t.get("paint-order") == "stroke" and t.get("stroke") == "white"
                            for t in captions)
    over |= {id(t) for t in captions}
    texts = [(id(t) in over, _text_box(t)) for t in root.iter(f"{{{NS['s']}}}text")]
    for p, pts in lines:
        routed = p.get("class") == "edge-route"
        for a, b in ((a, b) for poly in pts for a, b in zip(poly, poly[1:])):
            bad = [t for boxed, t in texts if (routed or not boxed) and _hits(a, b, t)]
            assert not bad, (p.get("data-src"), p.get("data-dst"), a, b, bad)
