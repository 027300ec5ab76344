"""explore(): the widget app builds, and clicks/search/collapse update it."""

from __future__ import annotations

import ipywidgets as W
import pytest
from plotly.callbacks import Points

import jointlab as jl
import jointlab.meta
import jointlab.widgets._explore as explore_mod  # noqa: E402
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
