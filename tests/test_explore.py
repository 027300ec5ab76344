"""explore(): the widget app builds around the canvas DAG view, and clicks/search/collapse
update it. What the browser draws from these traits is checked in tests/test_browser.py."""

from __future__ import annotations

import re

import ipywidgets as W
import pytest

import jointlab as jl
import jointlab.widgets._explore as explore_mod
from jointlab.widgets._dagcursor import ALL, FIT, DagWidget
from tests.fixtures import zoo


@pytest.fixture(scope="module")
def joint():
    f = zoo.FIXTURES["mlp"]
    return jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))


@pytest.fixture(scope="module")
def lm():
    f = zoo.FIXTURES["tiny_lm"]
    return jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))


def table_text(app):
    """The node names heading the rows of explore's table (its HTML's row headers)."""
    return re.findall(r"<tr>\s*<th>([^<]+)</th>", app.table.value)


def _meta(n):
    return n.meta["jointlab"]


def _click(app, name, k=1):
    app.view.click = {"name": name, "n": k}  # what the browser sends on a canvas click


def _expected_items(joint, names, depth):
    """Independent of the view: a node's module path cut at ``depth`` (the node if shallower)."""
    out = []
    for n in joint.graph.nodes:
        if n.name not in names:
            continue
        parts = _meta(n).get("module", "").split(".") if _meta(n).get("module") else []
        item = n.name if depth is None or len(parts) < depth else ".".join(parts[:depth])
        if item not in out:
            out.append(item)
    return out


def test_explore_builds_with_its_widgets(joint):
    w = explore_mod.explore(joint)
    app = w.explorer
    assert isinstance(w, W.VBox)
    assert isinstance(app.search, W.Text) and isinstance(app.depth, W.Dropdown)
    assert isinstance(app.view, DagWidget) and app.view in w.children
    assert set(app.phases) >= {"forward", "backward", "param", "input"}
    assert app.view.payload["nodes"]["name"] == [n.name for n in joint.graph.nodes]
    assert not app.view.own_search  # one search box: explore's, which works at every depth
    assert "Joint graph" in app.view.payload["title"]
    assert app.table.value == ""


def test_click_shows_row_and_twin(joint):
    app = explore_mod.explore(joint).explorer
    node = next(n for n in joint.graph.nodes if _meta(n).get("fwd_twin"))
    twin = _meta(node)["fwd_twin"]
    _click(app, node.name)
    assert node.name in app.selected and twin in app.selected
    assert {node.name, twin} <= set(app.view.selected)
    text = table_text(app)
    assert node.name in text and twin in text


@pytest.mark.parametrize("depth", [None, 1, 2])
def test_search_finds_ops_at_every_depth(lm, depth):
    app = explore_mod.explore(lm, depth=ALL if depth is None else depth).explorer
    app.search.value = "addmm"
    want = [n.name for n in lm.graph.nodes if _meta(n).get("target") == "aten.addmm"]
    assert want and sorted(app.chosen) == sorted(want)
    assert sorted(app.view.selected) == sorted(want)  # the view highlights the nodes
    items = _expected_items(lm, set(want), depth)
    assert app.selected == items
    if depth is not None:
        assert all(i not in want for i in items)  # groups, each named in the status
        assert f"in <b>{len(items)}</b> group(s)" in app.status.value
    assert all(w in table_text(app) for w in want)
    app.search.value = "aten.addmm"  # the placeholder's spelling
    assert sorted(app.chosen) == sorted(want)


def test_selection_survives_depth_changes(lm):
    app = explore_mod.explore(lm).explorer
    node = next(n for n in lm.graph.nodes if _meta(n).get("fwd_twin")
                and _meta(n)["module"].count(".") >= 1)
    _click(app, node.name)
    chosen = list(app.chosen)
    assert len(chosen) >= 2
    app.depth.value = 1
    assert app.chosen == chosen and app.view.depth == 1
    assert app.selected == _expected_items(lm, set(chosen), 1)
    app.depth.value = 2
    assert app.selected == _expected_items(lm, set(chosen), 2) != _expected_items(lm, chosen, 1)
    app.depth.value = ALL
    assert sorted(app.selected) == sorted(chosen) and app.view.depth == ALL


def test_phase_toggles_hide_phases_in_the_view(joint):
    app = explore_mod.explore(joint, depth=1).explorer
    assert app.view.hidden == []
    app.phases["backward"].value = False
    assert app.view.hidden == ["backward"]
    app.phases["param"].value = False  # grouped too: the view leaves them out of the boxes
    assert sorted(app.view.hidden) == ["backward", "param"]
    app.phases["backward"].value = app.phases["param"].value = True
    assert app.view.hidden == []


def test_collapse_dropdown_labels_all_nodes_by_default(joint):
    app = explore_mod.explore(joint).explorer
    assert app.depth.label == "all nodes" and app.depth.index == 0
    assert app.depth_value is None and app.view.depth == ALL
    app.depth.value = 2
    assert app.depth.label == "depth 2" and app.view.depth == 2
    app.depth.value = FIT
    assert app.depth.label == "fit budget" and app.view.depth == FIT
    app.depth.index = 0
    assert app.depth.label == "all nodes" and app.view.depth == ALL


def test_opened_groups_follow_the_payload_at_fit(lm):
    app = explore_mod.explore(lm).explorer
    p = app.view.payload
    assert explore_mod.opened_groups(p, ALL) is None
    assert explore_mod.opened_groups(p, FIT) == set(p["expanded"]) | {0}
    lvl = p["groups"]["level"]
    assert explore_mod.opened_groups(p, 2) == {g for g, v in enumerate(lvl) if v < 2}
