"""The DAG layout (geometry checked against the fx graph itself) and plot_dag, dag_view's alias."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

import jointlab as jl
import jointlab.meta
from jointlab.viz import _crossings, _hierarchy, _layout, dag, dagview
from jointlab.viz._dagdata import collapse, graph_data
from tests.fixtures import zoo

HOSTILE = "</script><script>alert(1)</script>"


@pytest.fixture(scope="module")
def joint():
    f = zoo.FIXTURES["tiny_lm"]
    return jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))


@pytest.fixture(scope="module")
def laid(joint):
    data = graph_data(joint)
    return data, _layout.layered_layout(data.is_bwd, data.src, data.dst, data.twin)


def fx_edges(joint):
    nodes = list(joint.graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    return [(pos[a], pos[n]) for n in nodes for a in n.all_input_nodes]


def test_no_two_nodes_overlap(joint, laid):
    _, lay = laid
    pts = np.stack([lay.x, lay.y], axis=1)
    assert len(pts) == len(joint.graph.nodes)
    d = np.abs(pts[:, None, :] - pts[None, :, :]).max(axis=2)
    np.fill_diagonal(d, np.inf)
    assert d.min() >= 0.5  # markers sit on a grid at least half a slot apart


def test_every_edge_flows_with_its_band(joint, laid):
    """Forward edges point right, backward edges left (the backward band is mirrored)."""
    data, lay = laid
    edges = fx_edges(joint)
    assert edges
    bwd = np.asarray(data.is_bwd)
    fwd_edges = [(s, d) for s, d in edges if not bwd[s] and not bwd[d]]
    bwd_edges = [(s, d) for s, d in edges if bwd[s] and bwd[d]]
    assert len(fwd_edges) > 50 and len(bwd_edges) > 50
    assert all(lay.layer[s] < lay.layer[d] for s, d in fwd_edges)
    assert all(lay.x[s] < lay.x[d] for s, d in fwd_edges)
    assert all(lay.x[s] > lay.x[d] for s, d in bwd_edges)


def test_backward_band_mirrors_forward(joint, laid):
    data, lay = laid
    phase = [jl.meta.phase(n) for n in joint.graph.nodes]
    fwd = np.array([p in ("param", "buffer", "input", "forward") for p in phase])
    assert (lay.y[fwd] > 0).all() and (lay.y[~fwd] < 0).all()
    pairs = [(i, t) for i, t in enumerate(data.twin) if t >= 0]
    assert len(pairs) > 20
    dx = np.array([abs(lay.x[i] - lay.x[t]) for i, t in pairs])
    span = lay.x.max() - lay.x.min()
    # a backward node sits (nearly) under the forward node it differentiates
    assert np.median(dx) <= 0.05 * span
    assert np.mean(dx <= 3) >= 0.7, np.mean(dx <= 3)


def _segment_crossings(x, y, edges):
    """Brute-force proper intersections of straight edge segments (independent of _layout)."""
    e = np.array(edges)
    p1 = np.stack([x[e[:, 0]], y[e[:, 0]]], 1)
    p2 = np.stack([x[e[:, 1]], y[e[:, 1]]], 1)

    def orient(a, b, c):
        return np.sign((b[..., 0] - a[..., 0]) * (c[..., 1] - a[..., 1])
                       - (b[..., 1] - a[..., 1]) * (c[..., 0] - a[..., 0]))

    A, B = p1[:, None], p2[:, None]
    C, D = p1[None], p2[None]
    shared = (e[:, None, 0] == e[None, :, 0]) | (e[:, None, 0] == e[None, :, 1]) | \
        (e[:, None, 1] == e[None, :, 0]) | (e[:, None, 1] == e[None, :, 1])
    hit = (orient(A, B, C) * orient(A, B, D) < 0) & (orient(C, D, A) * orient(C, D, B) < 0)
    return int(np.triu(hit & ~shared, 1).sum())


def test_barycentre_reduces_adjacent_column_crossings_on_a_real_graph(joint):
    data = graph_data(joint)
    before = _layout.layered_layout(data.is_bwd, data.src, data.dst, data.twin, sweeps=0)
    after = _layout.layered_layout(data.is_bwd, data.src, data.dst, data.twin, sweeps=4)
    assert _crossings.crossings(after.x, after.y, data.src, data.dst) < \
        _crossings.crossings(before.x, before.y, data.src, data.dst)


@pytest.mark.parametrize("name", ["tiny_lm", "cnn_bn", "nested_inputs", "shared_submodule"])
def test_barycentre_reduces_all_segment_crossings_on_a_real_graph(name):
    # the sweeps alone could undo each other (tiny_lm: 1278 crossings after four sweeps
    # against 918 after the mirror); the layout keeps the order with the fewest
    f = zoo.FIXTURES[name]
    joint = jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))
    data = graph_data(joint)
    edges = fx_edges(joint)
    before = _layout.layered_layout(data.is_bwd, data.src, data.dst, data.twin, sweeps=0)
    after = _layout.layered_layout(data.is_bwd, data.src, data.dst, data.twin, sweeps=4)
    assert _segment_crossings(after.x, after.y, edges) < \
        _segment_crossings(before.x, before.y, edges)


def test_edges_are_one_trace_of_straight_or_one_bend_polylines(joint, laid):
    data, lay = laid
    xs = lay.edge_x
    gaps = np.flatnonzero(np.isnan(xs))
    assert len(gaps) == len(data.src)  # one NaN separator per edge
    seg_len = np.diff(np.r_[-1, gaps]) - 1
    assert set(seg_len.tolist()) <= {2, 3}  # 2 points (straight) or 3 (one bend)


class Hostile(nn.Module):
    def __init__(self):
        super().__init__()
        self.add_module(HOSTILE, nn.Linear(4, 4))

    def forward(self, x):
        return getattr(self, HOSTILE)(x).relu()


def _alias(*args, **kw):
    """``plot_dag(...)``, its DeprecationWarning checked and swallowed."""
    with pytest.warns(DeprecationWarning, match=r"plot_dag\(\.\.\.\) is deprecated.*dag_view"):
        return dag.plot_dag(*args, **kw)


def test_plot_dag_is_dag_view_with_a_deprecation_pointing_at_the_caller(joint):
    with pytest.warns(DeprecationWarning) as record:
        view = dag.plot_dag(joint)
    (w,) = [w for w in record if issubclass(w.category, DeprecationWarning)]
    assert w.filename == __file__ and "jl.dag_view" in str(w.message)
    assert isinstance(view, dagview.DagView)
    # the same payload dag_view gives with every node open, coloured by phase as before
    want = dagview.dag_view(joint, budget=len(joint.graph.nodes), color_by="phase").payload
    assert view.payload == want
    assert len(view.payload["expanded"]) == len(view.payload["groups"]["name"])


def test_hostile_module_names_stay_data_in_the_alias_html():
    m = Hostile()
    j = jl.trace(m, lambda mod, x: mod(x).sum(), {"x": torch.randn(2, 4)})
    assert any(HOSTILE in jl.meta.module(n) for n in j.graph.nodes)
    page = _alias(j).html(full_html=True)
    assert "<script>alert(1)" not in page and "</script><script>alert" not in page
    assert HOSTILE in _alias(j).payload["groups"]["name"]  # kept, as JSON data


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_collapse_counts_sum_to_node_count(joint, depth):
    data = collapse(graph_data(joint), depth)
    counts = {name: m["count"] for name, m in zip(data.names, data.info)}
    assert sum(counts.values()) == len(joint.graph.nodes)
    # independent count by module prefix of the forward side
    expected: dict[str, int] = {}
    for n in joint.graph.nodes:
        m = jl.meta.info(n)
        if m["phase"] in ("param", "buffer", "input", "forward"):
            key = "fwd:" + (".".join(m["module"].split(".")[:depth]) or "(root)")
            expected[key] = expected.get(key, 0) + 1
    assert {k: v for k, v in counts.items() if k.startswith("fwd:")} == expected


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_alias_depth_opens_that_many_module_levels(joint, depth):
    from jointlab.viz._hierarchy import module_tree

    tree = module_tree([jl.meta.module(n) for n in joint.graph.nodes])
    assert tree.level.max() > depth  # the graph is deeper than what is opened
    opened = sorted(_alias(joint, depth=depth).payload["expanded"])
    assert opened == [g for g in range(len(tree.names)) if tree.level[g] < max(depth, 1)]


def test_alias_refuses_what_the_view_cannot_draw(joint):
    node = next(n for n in joint.graph.nodes if n.meta.get("jointlab", {}).get("fwd_twin"))
    for kw, what in (({"relations": True}, "relations"), ({"sweeps": 2}, "sweeps"),
                     ({"phases": ["forward"]}, "phases"),
                     ({"highlight": node.name}, "highlight")):
        with pytest.raises(jl.errors.PlotArgumentError, match=what):
            _alias(joint, **kw)
    assert _alias(joint, relations=False).payload  # nothing to draw: accepted


@pytest.mark.parametrize("color_by", dag.COLOR_BY)
def test_alias_colours_and_self_contained_html(joint, color_by):
    view = _alias(joint, color_by=color_by, title="my graph", height=321)
    assert view.payload["color_by"] == color_by and view.payload["title"] == "my graph"
    page = view._repr_html_()
    assert not re.search(r"<script[^>]*\ssrc=", page)  # no external script
    assert 'style="height:321px"' in page


def test_bad_arguments(joint):
    with pytest.raises(jl.errors.PlotArgumentError, match="color_by"):
        _alias(joint, color_by="rainbow")
    for bad in (-1, 1.5, True):
        with pytest.raises(jl.errors.PlotArgumentError, match="depth"):
            _alias(joint, depth=bad)


FIRST_FIGURE = """
import json, sys, warnings
import jointlab as jl
from IPython.core.interactiveshell import InteractiveShell
from tests.fixtures import zoo
shell = InteractiveShell.instance()
f = zoo.FIXTURES["tiny_lm"]
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    fig = jl.plot_dag(jl.trace(f.make_model(), f.train_fn, f.make_inputs(2)))
sent = [shell.display_formatter.format(fig)[0]]  # the bundle a cell ending in `fig` sends
plotly = sorted(m for m in sys.modules if m == "plotly" or m.startswith("plotly."))
print("\\nRESULT " + json.dumps({"plotly": plotly, "sent": sent}))
"""


def test_first_plot_dag_displays_as_html_without_plotly():
    """A fresh kernel's first plot_dag: the view's HTML (what Colab renders), no plotly."""
    import json
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c", FIRST_FIGURE], capture_output=True, text=True,
                       cwd=root, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert got["plotly"] == [], f"the first plot_dag imported {got['plotly']}"
    assert len(got["sent"]) == 1, got["sent"]
    page = got["sent"][0]["text/html"]
    assert 'class="jl-dag"' in page and "window.jointlabDag(" in page, page[:500]


# -- dag_view: the bundled renderer's payload ------------------------------------------


def test_title_and_summary_card_count_phases_alike(joint):
    from jointlab.analysis.tables import card_facts

    title = dagview.dag_view(joint).payload["title"]
    shown = {p: int(c.replace(",", "")) for p, c in re.findall(r"(\w+) ([\d,]+)", title)
             if p in jointlab.meta.PHASES}
    card = {p: c for p, c in card_facts(joint)["phases"].items() if c}
    assert shown == card
    # and both agree with a count straight off the graph
    assert shown["forward"] == sum(jl.meta.phase(n) == "forward" for n in joint.graph.nodes)


def test_labels_name_parameters_by_fqn_and_ops_without_namespace(joint):
    p = dagview.dag_view(joint).payload
    labels = [p["tables"]["label"][k] for k in p["nodes"]["label"]]
    for n, lab in zip(joint.graph.nodes, labels):
        m = jl.meta.info(n)
        if m["phase"] == "param":
            assert lab == m["fqn"] and not re.fullmatch(r"arg\d+_\d+", lab)
        elif n.op == "call_function" and str(m["target"]).startswith("aten."):
            assert lab == str(m["target"]).split(".")[1]  # aten.mm(.default) -> mm
    assert "mm" in labels and any(lab.endswith("_backward") for lab in labels)


def test_view_html_is_self_contained_and_escapes_hostile_names():
    j = jl.trace(Hostile(), lambda mod, x: mod(x).sum(), {"x": torch.randn(2, 4)})
    page = dagview.dag_view(j).html(full_html=True)
    assert "<script>alert(1)" not in page and "</script><script>alert" not in page
    assert not re.search(r"<script[^>]*\ssrc=", page) and "cdn" not in page.lower()
    assert "\\u003c/script\\u003e" in page  # the name travels as escaped JSON data


def _modules_of_gpt2_like(layers: int, hf: bool) -> list[str]:
    pre = "transformer." if hf else ""
    mods = [f"{pre}wte", f"{pre}wpe", f"{pre}drop", f"{pre}ln_f", "lm_head", "<train_fn>", ""]
    for k in range(layers):
        mods += [f"{pre}h.{k}", f"{pre}h.{k}.ln_1", f"{pre}h.{k}.attn", f"{pre}h.{k}.attn.c_attn",
                 f"{pre}h.{k}.mlp", f"{pre}h.{k}.mlp.c_fc"]
    return [m for m in mods for _ in range(10)]  # 10 nodes per module


@pytest.mark.parametrize("hf", [False, True])
def test_collapse_level_counts_from_the_branch_point(hf):
    mods = _modules_of_gpt2_like(12, hf)
    tree = _hierarchy.module_tree(mods)
    bwd = np.zeros(len(mods), dtype=bool)
    bwd[::2] = True
    # a budget that fits the blocks as boxes but not their insides
    opened = _hierarchy.fitting_expansion(tree, bwd, budget=200)
    pre = "transformer." if hf else ""
    idx = {n: i for i, n in enumerate(tree.names)}
    blocks = [idx[f"{pre}h.{k}"] for k in range(12)]
    assert not opened[blocks].any()  # 12 separate closed blocks ...
    assert opened[tree.parent[blocks]].all()  # ... inside an open h
    assert _hierarchy.visible_count(tree, bwd, opened) <= 200
    assert len({int(tree.level[b]) for b in blocks}) == 1
    # the HF path is one level deeper in FQN components, not in branching levels
    assert int(tree.level[blocks[0]]) == (3 if hf else 2)


def test_visible_count_matches_an_independent_count():
    mods = _modules_of_gpt2_like(3, False)
    tree = _hierarchy.module_tree(mods)
    bwd = np.arange(len(mods)) % 3 == 0
    opened = np.zeros(len(tree.names), dtype=bool)
    opened[0] = True
    opened[tree.names.index("h")] = True
    # independent: root's own nodes + h's own nodes + one box per band of each other child
    own = sum(m in ("",) for m in mods)
    boxes = 0
    for top in {"wte", "wpe", "drop", "ln_f", "lm_head", "<train_fn>", "h.0", "h.1", "h.2"}:
        sel = [i for i, m in enumerate(mods) if jointlab.meta.in_module(m, top)]
        boxes += len({bool(bwd[i]) for i in sel})
    assert _hierarchy.visible_count(tree, bwd, opened) == own + boxes


def test_palette_has_no_repeats():
    assert len(set(dagview.PALETTE)) == len(dagview.PALETTE) == 20


def test_a_single_child_chain_adds_no_level():
    # ``outer`` and ``outer.inner`` hold nothing but one child each: folded away, so the
    # blocks sit where they would without the wrapper
    one = _hierarchy.module_tree(["", "outer.inner.h.0", "outer.inner.h.1", "outer.inner.h.0"])
    flat = _hierarchy.module_tree(["", "h.0", "h.1", "h.0"])
    assert "outer" not in one.names and "outer.inner" not in one.names
    assert one.level[one.names.index("outer.inner.h.0")] == flat.level[flat.names.index("h.0")]
    assert list(one.node_group) == [0, *(one.names.index(m) for m in (
        "outer.inner.h.0", "outer.inner.h.1", "outer.inner.h.0"))]


def _band_nodes(joint, group: str, backward: bool):
    return [n for n in joint.graph.nodes
            if (group == "" or jointlab.meta.in_module(jointlab.meta.module(n), group))
            and (jointlab.meta.info(n).get("phase") in dagview.BACKWARD_PHASES) == backward]


def test_numeric_layer_groups_show_the_largest_value_of_their_nodes(joint):
    nodes = list(joint.graph.nodes)
    vals = {n.name: float(i % 7) + 0.5 for i, n in enumerate(nodes) if i % 3}  # some unknown
    P = dagview.build_payload(joint, layers={"norm": vals})
    L = P["layers"]["norm"]
    assert L["kind"] == "num" and L["v"] == [vals.get(n.name) for n in nodes]
    assert (L["lo"], L["hi"]) == (min(vals.values()), max(vals.values()))
    for gid, name in enumerate(P["groups"]["name"]):
        for key, bwd in (("gf", False), ("gb", True)):
            known = [vals[n.name] for n in _band_nodes(joint, name, bwd) if n.name in vals]
            assert L[key][gid] == (max(known) if known else None), (name, key)


def test_label_layer_groups_keep_a_label_only_when_all_nodes_share_it(joint):
    nodes = list(joint.graph.nodes)
    labels = {n.name: jointlab.meta.module(n).split(".")[0] or "root" for n in nodes}
    P = dagview.build_payload(joint, layers={"top": labels}, color_by="top")
    L = P["layers"]["top"]
    assert L["kind"] == "cat" and sorted(L["levels"]) == sorted(set(labels.values()))
    for gid, name in enumerate(P["groups"]["name"]):
        for key, bwd in (("gf", False), ("gb", True)):
            seen = {labels[n.name] for n in _band_nodes(joint, name, bwd)}
            want = -1 if not seen else L["levels"].index(seen.pop()) if len(seen) == 1 else -2
            assert L[key][gid] == want, (name, key)
    with pytest.raises(ValueError, match="top"):
        dagview.dag_view(joint, color_by="nope", layers={"top": labels})


KERNEL_NAMES = {  # Inductor's names (torch 2.13, CPU) and the legend's short form
    "cpp_fused_add_native_layer_norm_native_layer_norm_backward_view_5:17":
        "add_layer_norm+bwd #5@17",
    "cpp_fused__log_softmax__log_softmax_backward_data_arange_eq_expand_nll_loss_backward"
    "_nll_loss_forward_ones_like_scalar_tensor_view_6:19": "log_softmax+bwd_eq_nll_lo… #6@19",
    "extern_kernels.addmm:56": "addmm @56",
    "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default:50":
        "sdpa_bwd @50",
    "cpp_fused_gelu_view_2:7, cpp_fused_gelu_backward_view_9:42": "gelu #2@7 +1",
    "bf16": "bf16",
}


@pytest.mark.parametrize("name", sorted(KERNEL_NAMES))
def test_kernel_names_shorten_to_their_ops_and_numbers(name):
    from jointlab.viz import _legend

    assert _legend.short_label(name) == KERNEL_NAMES[name]
    assert len(_legend.short_label(name * 5)) <= _legend.LABEL_MAX


def test_label_layer_ranks_levels_and_shortens_only_the_legend(joint):
    from collections import Counter

    from jointlab.viz import _legend

    nodes = [n.name for n in joint.graph.nodes]
    fused = "cpp_fused_" + "_".join(["add", "mul", "native_layer_norm_backward"] * 8)
    key = [i % 40 if i < len(nodes) // 2 else 39 for i in range(len(nodes))]  # 39: most, last
    labels = {n: f"{fused}_{k}:{k}" for i, (n, k) in enumerate(zip(nodes, key)) if i % 5}
    counts = Counter(labels.values())
    L = dagview.build_payload(joint, layers={"kernel": labels})["layers"]["kernel"]
    assert [counts[k] for k in L["levels"]] == sorted(counts.values(), reverse=True)
    assert L["levels"][0].endswith("_39:39")
    assert set(L["levels"]) == set(counts)  # full names: the detail panel and tooltips
    assert len(L["short"]) == _legend.LEGEND_LEVELS < len(L["levels"])
    assert all(len(s) <= _legend.LABEL_MAX for s in L["short"]), L["short"]
    shown = L["colors"][:_legend.LEGEND_LEVELS]
    assert len(set(shown)) == len(shown) and set(shown) <= set(dagview.PALETTE)
    assert not any(c[1:3] == c[3:5] == c[5:7] for c in shown)  # greys mean mixed / none
    assert len(L["colors"]) == len(L["levels"])


def test_the_layouts_crossing_count_is_the_usual_measure(joint):
    # the count the layout keeps its order by (a Fenwick tree per gap) against the
    # vectorised pairwise count of crossings(), on every sweep's order
    data = graph_data(joint)
    src, dst = np.asarray(data.src), np.asarray(data.dst)
    for sweeps in range(5):
        lay = _layout.layered_layout(data.is_bwd, data.src, data.dst, data.twin, sweeps=sweeps)
        gaps = _crossings.gap_edges(lay.x.tolist(), src.tolist(), dst.tolist())
        assert _crossings.crossing_count(gaps, lay.y.tolist()) == \
            _crossings.crossings(lay.x, lay.y, src, dst)
