"""explore(): the widget app builds, and clicks/search/collapse update it."""

from __future__ import annotations

import ipywidgets as W
import numpy as np
import pytest
from plotly.callbacks import Points

import jointlab as jl
import jointlab.meta
import jointlab.widgets._explore as explore_mod  # noqa: E402
from jointlab.viz import dag
from tests.fixtures import zoo


@pytest.fixture(scope="module")
def joint():
    f = zoo.FIXTURES["mlp"]
    return jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))


def click(tr, i):
    tr._dispatch_on_click(Points(point_inds=[i], xs=[tr.x[i]], ys=[tr.y[i]],
                                 trace_name=tr.name, trace_index=0), None)


def table_text(app):
    return "".join(o["data"]["text/plain"] for o in app.table.outputs)


def test_explore_builds_with_its_widgets(joint):
    w = explore_mod.explore(joint)
    app = w.explorer
    assert isinstance(w, W.VBox)
    assert isinstance(app.search, W.Text) and isinstance(app.depth, W.Dropdown)
    assert set(app.phases) >= {"forward", "backward", "param"}
    assert sum(len(t.x) for t in app._node_traces()) == len(joint.graph.nodes)
    assert app.table.outputs == ()


def test_click_shows_row_and_twin(joint):
    app = explore_mod.explore(joint).explorer
    bwd = next(t for t in app.fig.data if t.name == "backward")
    i = next(k for k, n in enumerate(bwd.customdata)
             if jl.meta.info(joint.graph.find_nodes(op="call_function", target=None)[0]
                              if False else _node(joint, n)).get("fwd_twin"))
    name = bwd.customdata[i]
    twin = _node(joint, name).meta["jointlab"]["fwd_twin"]
    click(bwd, i)
    assert name in app.selected and twin in app.selected
    text = table_text(app)
    assert name in text and twin in text
    ring = app.fig.data[-1]
    assert (bwd.x[i], bwd.y[i]) in set(zip(ring.x, ring.y))


def _node(joint, name):
    return next(n for n in joint.graph.nodes if n.name == name)


def test_search_phase_toggle_and_collapse(joint):
    app = explore_mod.explore(joint).explorer
    app.search.value = "addmm"
    want = [n.name for n in joint.graph.nodes if "addmm" in str(n.meta["jointlab"].get("target"))]
    assert want and sorted(app.selected) == sorted(want)
    app.phases["backward"].value = False
    assert next(t for t in app.fig.data if t.name == "backward").visible is False
    app.depth.value = 1
    counts = sum(len(m) for m in app.data.members)
    assert counts == len(joint.graph.nodes)
    grp = next(t for t in app.fig.data if t.name == "forward")
    click(grp, 0)
    assert len(app.table.outputs) == 1


# -- the fixes of issue 14 -----------------------------------------------------------------
def _segments(tr):
    """Number of edge polylines in a line trace (each ends in one gap)."""
    return int(np.isnan(np.asarray([np.nan if v is None else v for v in tr.x], float)).sum())


def _trace_named(app_or_fig, name):
    fig = getattr(app_or_fig, "fig", app_or_fig)
    return next(t for t in fig.data if t.name == name)


def _floats(xs):
    """Coordinates with gaps as None, whether they came as NaN or None."""
    return [None if v is None or v != v else float(v) for v in xs]


def _phase(n):
    return n.meta["jointlab"]["phase"]


def _graph_edges(joint, hidden=()):
    """Graph edges into non-output nodes, both ends outside ``hidden`` phases (from FX)."""
    return sum(1 for n in joint.graph.nodes for a in n.all_input_nodes
               if _phase(n) != "output" and _phase(n) not in hidden
               and _phase(a) not in hidden)


def test_collapse_dropdown_labels_all_nodes_by_default(joint):
    app = explore_mod.explore(joint).explorer
    assert app.depth.label == "all nodes" and app.depth.index == 0
    assert app.depth_value is None and not app.data.members
    app.depth.value = 2
    assert app.depth.label == "depth 2" and app.data.members
    app.depth.index = 0
    assert app.depth.label == "all nodes" and len(app.data.names) == len(joint.graph.nodes)


@pytest.mark.parametrize("depth", [1, 2])
def test_search_finds_ops_when_grouped(joint, depth):
    app = explore_mod.explore(joint, depth=depth).explorer
    app.search.value = "addmm"
    want = [n.name for n in joint.graph.nodes if n.meta["jointlab"].get("target") == "aten.addmm"]
    assert want and sorted(app.chosen) == sorted(want)
    groups = [g for g, mem in zip(app.data.names, app.data.members) if set(mem) & set(want)]
    assert groups and sorted(app.selected) == sorted(groups)
    assert len(_trace_named(app, "selected").x) == len(groups)
    assert all(w in table_text(app) for w in want)
    app.search.value = "aten.addmm"  # the placeholder's spelling
    assert sorted(app.chosen) == sorted(want)


def test_selection_survives_depth_changes(joint):
    app = explore_mod.explore(joint).explorer
    bwd = _trace_named(app, "backward")
    click(bwd, 0)
    chosen = list(app.chosen)
    assert chosen
    app.depth.value = 1
    assert app.chosen == chosen
    groups = [g for g, mem in zip(app.data.names, app.data.members) if set(mem) & set(chosen)]
    assert groups and app.selected == groups
    assert len(_trace_named(app, "selected").x) == len(groups)
    app.depth.value = explore_mod.ALL
    assert sorted(app.selected) == sorted(chosen)
    assert len(_trace_named(app, "selected").x) == len(chosen)


@pytest.mark.parametrize("depth", [None, 1])
def test_phase_toggle_hides_the_edges_of_hidden_nodes(joint, depth):
    app = explore_mod.explore(joint, depth=depth).explorer
    edges = _trace_named(app, "edges")
    drawn = _trace_named(dag.plot_dag(joint, depth=depth, height=app.height), "edges")
    assert _floats(edges.x) == _floats(drawn.x) and _floats(edges.y) == _floats(drawn.y)
    if depth is None:
        assert _segments(edges) == _graph_edges(joint)
    before = _segments(edges)
    app.phases["backward"].value = False
    after = _segments(_trace_named(app, "edges"))
    if depth is None:
        assert after == _graph_edges(joint, hidden=("backward",)) < before
    else:  # groups: only edges between forward-band groups are left
        fwd = {i for i, m in enumerate(app.data.info) if m["phase"] != "backward"}
        want = sum(1 for s, t in zip(app.data.src, app.data.dst) if s in fwd and t in fwd
                   and app.data.info[t]["phase"] != "output")
        assert after == want < before
    app.phases["backward"].value = True
    assert _segments(_trace_named(app, "edges")) == before


def test_param_toggle_regroups_without_parameters(joint):
    app = explore_mod.explore(joint, depth=1).explorer
    assert sum(len(m) for m in app.data.members) == len(joint.graph.nodes)
    app.phases["param"].value = False
    kept = [n.name for n in joint.graph.nodes if _phase(n) != "param"]
    assert sorted(m for mem in app.data.members for m in mem) == sorted(kept)
    app.phases["input"].value = False
    kept = [n.name for n in joint.graph.nodes if _phase(n) not in ("param", "input")]
    assert sum(len(m) for m in app.data.members) == len(kept)
    app.phases["param"].value = app.phases["input"].value = True
    assert sum(len(m) for m in app.data.members) == len(joint.graph.nodes)


def test_title_sits_above_the_figure_clear_of_the_modebar(joint):
    app = explore_mod.explore(joint).explorer
    assert not app.fig.layout.title.text
    assert "Joint graph" in app.title.value
    assert app.widget.children.index(app.title) == app.widget.children.index(app.fig) - 1
