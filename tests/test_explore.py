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
from tests.test_browser import lab  # noqa: F401 - the JupyterLab server fixture


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


def test_search_moves_the_view_and_toggles_show_their_state(lm):
    """A search bumps ``focus`` after ``selected`` (the browser then moves to the hits); a
    phase toggle that is off is drawn plain, one that is on coloured with a check mark."""
    app = explore_mod.explore(lm).explorer
    assert app.view.focus == 0
    sent = []
    app.view.observe(lambda ch: sent.append((ch["name"], list(app.view.selected))),
                     names=["selected", "focus"])
    app.search.value = "nll_loss_backward"
    hits = [n.name for n in lm.graph.nodes if "nll_loss_backward" in str(_meta(n)["target"])]
    assert hits and sent == [("selected", hits), ("focus", hits)]
    on = app.phases["backward"]
    assert (on.value, on.button_style, on.icon) == (True, "info", "check")
    on.value = False
    assert (on.button_style, on.icon) == ("", "")
    assert "hidden" in on.tooltip and app.view.hidden == ["backward"]
    on.value = True
    assert (on.button_style, on.icon) == ("info", "check")


EXPLORE_CELLS = [
    "import sys; sys.path.insert(0, {repo!r})",
    "import jointlab as jl\nfrom tests.fixtures import zoo\nf = zoo.FIXTURES['tiny_lm']\n"
    "joint = jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))",
    "jl.explore(joint, height=420)",
]
VIEW = "document.querySelector('.jl-explore-dag').jlView"
#: Screen positions of the view's hits inside its canvas ([x, y, w, h] each).
HITS_ON_SCREEN = f"""() => {{ const v = {VIEW}, W = v.canvas.clientWidth,
    H = v.canvas.clientHeight;
  return [...v.hits].map(i => {{ const it = v.itemOf[i] >= 0 ? v.itemOf[i] : i;
    const [x, y] = v.toScreen(...v.itemXY(it)); return [x, y, W, H]; }}); }}"""
TOGGLE_LOOK = """b => { const s = getComputedStyle(b);
  return {bg: s.backgroundColor, fg: s.color, icon: !!b.querySelector('i.fa-check, i.fa')}; }"""


@pytest.mark.browser
@pytest.mark.parametrize("width", [1280, 1024])
def test_search_brings_hits_into_view_in_jupyterlab(lab, tmp_path, width):  # noqa: F811
    """In JupyterLab: a search for the loss's backward (off-screen at first) moves the view
    onto it; the toggle of a hidden phase does not look like the shown ones."""
    from tests.chromium import browser, code_notebook, save_screenshot
    from tests.test_browser import REPO, _assert_no_error_outputs, _open_and_run_all

    nb = code_notebook(tmp_path / "explore.ipynb",
                       [src.format(repo=str(REPO)) for src in EXPLORE_CELLS])
    with browser() as b:
        page, errors = _open_and_run_all(lab, b, "explore", src=nb, min_cells=3)
        _assert_no_error_outputs(page)
        page.set_viewport_size({"width": width, "height": 800})
        page.wait_for_function(f"() => {VIEW} && document.querySelector("
                               "'.jl-explore-dag').dataset.ready", timeout=60_000)
        page.locator(".jl-explore-dag").evaluate("el => el.scrollIntoView({block: 'center'})")
        page.wait_for_timeout(500)
        search = page.locator(".widget-text input").first
        search.fill("nll_loss_backward")
        search.press("Enter")
        page.wait_for_function(f"() => {VIEW}.hits.size > 0", timeout=30_000)
        try:  # the focus message follows the selection's: give a loaded machine time
            page.wait_for_function(f"() => ({HITS_ON_SCREEN})().every(([x, y, w, h]) => "
                                   "x >= 0 && x <= w && y >= 0 && y <= h)", timeout=20_000)
        except Exception:  # noqa: BLE001 - the assertion below says where the hits are
            pass
        spots = page.evaluate(HITS_ON_SCREEN)
        save_screenshot(page, tmp_path, f"explore_search_{width}")
        assert spots and all(0 <= x <= w and 0 <= y <= h for x, y, w, h in spots), spots
        backward = page.locator("button", has_text=re.compile(r"^\s*backward$")).first
        backward.click()
        page.wait_for_function(f"() => {VIEW}.hiddenPhases.has('backward')", timeout=30_000)
        page.mouse.click(5, 5)  # focus elsewhere: the look is the state, not the focus ring
        page.wait_for_timeout(300)
        off = backward.evaluate(TOGGLE_LOOK)
        shown = page.locator("button", has_text=re.compile(r"^\s*forward$")).first
        on = shown.evaluate(TOGGLE_LOOK)
        save_screenshot(page, tmp_path, f"explore_toggle_off_{width}")
        assert on["icon"] and not off["icon"], (on, off)
        assert on["bg"] != off["bg"], (on, off)
    assert errors.errors == [], errors.errors
