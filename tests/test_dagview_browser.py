"""The bundled DAG view (``jl.dag_view``) in headless Chromium, read from its own state.

What a user must be able to read is checked against the page: the labels drawn on the
canvas (text and screen rectangle, as the renderer placed them), the module colours, the
listeners the page holds (counted by wrapping the browser's own registration functions
before the view loads), and the diff view's detail panel in the DOM.
Screenshots go to ``$JOINTLAB_DAG_SHOTS`` (default ``/tmp/dag_shots``).
"""

from __future__ import annotations

import os
import pathlib

import pytest

from tests.chromium import browser, chromium_path, open_dag_page

pytestmark = pytest.mark.browser
SHOTS = pathlib.Path(os.environ.get("JOINTLAB_DAG_SHOTS", "/tmp/dag_shots"))
VIEW = "document.querySelector('.jl-dag').jlView"

# Counts what the page's own scripts (not the test driver's) register on window/document,
# and their live ResizeObservers and MutationObservers, by wrapping the browser's functions
# before any script runs; a registration is the page's when its call stack holds the page URL.
COUNT_LISTENERS = (pathlib.Path(__file__).parent / "count_listeners.js").read_text()


def _open(b, path, init: str | None = None, width: int = 1400, height: int = 760):
    return open_dag_page(b, path, init=init, width=width, height=height, timeout=120_000)


@pytest.fixture(scope="module")
def lm_joint():
    import jointlab as jl
    from tests.fixtures import zoo

    f = zoo.FIXTURES["tiny_lm"]
    return jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))


def test_listeners_are_released_when_the_view_leaves_the_document(lm_joint, tmp_path):
    from jointlab.viz.dagview import dag_view

    chromium_path()
    path = dag_view(lm_joint).write_html(tmp_path / "dag.html")
    with browser() as b:
        page, errors = _open(b, path, init=COUNT_LISTENERS)
        base = page.evaluate("() => ({...window.__jlLive})")
        assert base["resize"] >= 1 and base["mutation"] >= 1  # the view holds them while shown
        assert page.evaluate("() => window.jointlabDag.live()") == 1
        box = page.locator(".jl-canvas").bounding_box()
        page.mouse.move(box["x"] + 200, box["y"] + 200)
        page.mouse.down()
        page.mouse.move(box["x"] + 260, box["y"] + 230)
        during = page.evaluate("() => ({...window.__jlLive})")
        assert during["window"] > base["window"]  # a drag listens on the window ...
        page.mouse.up()
        live = "() => ({...window.__jlLive})"
        assert page.evaluate(live)["window"] == base["window"]  # ... until it ends
        page.evaluate(f"() => {{ window.__v = {VIEW}; "
                      "document.querySelector('.jl-dag').remove(); }")
        page.wait_for_function("() => !window.__jlLive.resize && !window.__jlLive.mutation",
                               timeout=5_000)
        after = page.evaluate("() => ({...window.__jlLive, views: window.jointlabDag.live(),"
                              " raf: window.__v._raf || 0, released: window.__v.released})")
        assert after["window"] == base["window"] == 0 and after["document"] == 0
        assert after["views"] == 0 and after["raf"] == 0 and after["released"] is True
    assert errors.errors == [], errors.errors


@pytest.fixture(scope="module")
def gpt2_joint():
    import jointlab as jl
    from tests.fixtures import real

    f = real.get("hf_gpt2")
    return jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))


def _matches(joint, query: str) -> list[str]:
    """Nodes a search for ``query`` should find, from the graph: name, label, op or module."""
    import jointlab as jl
    from jointlab.viz.dagview import node_label

    q = query.lower()
    return [n.name for n in joint.graph.nodes
            if any(q in str(s).lower() for s in (
                n.name, node_label(n, jl.meta.info(n)),
                jl.meta.info(n).get("target", n.op), jl.meta.module(n)))]


def _full_labels(joint) -> dict[str, str]:
    import jointlab as jl
    from jointlab.viz.dagview import node_label

    return {n.name: node_label(n, jl.meta.info(n)) for n in joint.graph.nodes}


def _settle(page) -> dict:
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    return page.evaluate(f"() => {VIEW}.state()")


def _assert_readable(s: dict, names, labels: dict[str, str], what: str) -> None:
    """Every node in ``names`` has its whole label drawn, inside the canvas, at a readable zoom."""
    W, H = s["canvas"]
    drawn = {p["name"]: p for p in s["pinned"]}
    for name in names:
        assert name in drawn, (what, name, sorted(drawn))
        p = drawn[name]
        x0, y0, x1, y1 = p["rect"]
        assert p["text"] == labels[name], (what, name, p["text"])  # whole, never cut
        assert 0 <= x0 < x1 <= W and 0 <= y0 < y1 <= H, (what, name, p["rect"], W, H)
        assert x1 - x0 >= 8 * len(labels[name]) * 0.5  # drawn at a readable size (11px font)


def _step_through(page, query: str, want: list[str], labels: dict[str, str], steps: int,
                  shot: str | None = None) -> dict:
    """Search, then step with Enter/Shift+Enter and the buttons; check each current hit."""
    page.fill(".jl-search", query)
    page.press(".jl-search", "Enter")
    s = _settle(page)
    n = len(want)
    assert s["hitCount"] == n and s["hits"] == n, (s["hitCount"], n)
    assert page.locator(".jl-count").text_content() == f"1 of {n}"
    if shot:
        page.screenshot(path=str(SHOTS / shot))
    for k in range(steps):
        if k:
            page.press(".jl-search", "Enter")
            s = _settle(page)
        assert s["current"] == want[k % n] and s["hitAt"] == k % n, (k, s["current"])
        assert s["ay"] == 1, "the view is never stretched"
        assert s["k"] * 3 >= 44, "a column is wide enough for labels"
        assert page.locator(".jl-count").text_content() == f"{k % n + 1} of {n}"
        on = page.evaluate(f"""() => {{ const v = {VIEW}, c = v.canvas, out = [];
            for (const i of v.hits) {{ if (v.itemOf[i] !== i) continue;
                const [sx, sy] = v.toScreen(v.x[i], v.y[i]);
                if (sx >= 0 && sy >= 0 && sx <= c.clientWidth && sy <= c.clientHeight)
                    out.push(v.P.nodes.name[i]); }} return out; }}""")
        assert want[k % n] in on
        _assert_readable(s, on, labels, f"{query} hit {k}")  # every open hit on screen
    page.press(".jl-search", "Shift+Enter")
    back = _settle(page)
    assert back["current"] == want[(steps - 2) % n], "Shift+Enter goes back"
    page.locator(".jl-next").click()
    assert _settle(page)["current"] == want[(steps - 1) % n], "the next button goes on"
    page.locator(".jl-prev").click()
    page.locator(".jl-prev").click()
    assert _settle(page)["current"] == want[(steps - 3) % n], "the previous button goes back"
    return s


def _pixel(page, name: str) -> str | None:
    """The colour the canvas shows at node ``name``'s centre, or None when it is not open."""
    return page.evaluate(f"""() => {{ const v = {VIEW}, i = v.P.nodes.name.indexOf({name!r});
        if (v.itemOf[i] !== i) return null;
        const [sx, sy] = v.toScreen(v.x[i], v.y[i]), d = window.devicePixelRatio || 1;
        if (sx < 10 || sy < 10 || sx > v.canvas.clientWidth - 10 || sy > v.canvas.clientHeight - 10)
            return null;
        const p = v.canvas.getContext('2d').getImageData(Math.round(sx * d), Math.round(sy * d),
                                                         1, 1).data;
        return '#' + [p[0], p[1], p[2]].map(x => x.toString(16).padStart(2, '0')).join(''); }}""")


def _module_pixels(page, joint) -> dict[str, str]:
    """Per module, the colour most of its open, on-screen nodes show at their centre.

    (A few centres lie under a neighbour's label or edge; most show the fill.)
    """
    from collections import Counter

    import jointlab as jl

    page.evaluate(f"() => {{ const v = {VIEW}; v.hits = new Set(); v.hitList = [];"
                  " v.current = -1; v.showLabels = false; v.render(); }")  # nothing on the centres
    out: dict[str, Counter] = {}
    for n in joint.graph.nodes:
        c = _pixel(page, n.name)
        if c:
            out.setdefault(jl.meta.module(n), Counter())[c] += 1
    page.evaluate(f"() => {{ const v = {VIEW}; v.showLabels = true; v.render(); }}")
    return {m: c.most_common(1)[0][0] for m, c in out.items()
            if c.most_common(1)[0][1] * 2 > sum(c.values())}


def test_search_steps_through_hits_with_readable_labels_and_stable_colours(gpt2_joint, tmp_path):
    from jointlab.viz._hierarchy import prefixes
    from jointlab.viz._style import module_colors
    from jointlab.viz.dagview import dag_view

    chromium_path()
    want = _matches(gpt2_joint, "addmm")
    assert len(want) >= 4
    labels = _full_labels(gpt2_joint)
    path = dag_view(gpt2_joint).write_html(tmp_path / "gpt2.html")
    SHOTS.mkdir(parents=True, exist_ok=True)
    import jointlab as jl
    mods = list(dict.fromkeys(jl.meta.module(n) for n in gpt2_joint.graph.nodes))
    ref = module_colors(["", *(p for m in mods for p in prefixes(m))])  # keyed by name, graph order
    with browser() as b:
        page, errors = _open(b, path)
        page.screenshot(path=str(SHOTS / "gpt2_open.png"))
        before = _module_pixels(page, gpt2_joint)
        assert len(before) >= 5
        for m, c in before.items():
            assert c == ref[m], (m, c, ref[m])
        _step_through(page, "addmm", want, labels, steps=len(want) + 1, shot="gpt2_addmm.png")
        page.screenshot(path=str(SHOTS / "gpt2_addmm_stepped.png"))
        after = _module_pixels(page, gpt2_joint)  # other modules are in view now
        assert len(after) >= 3 and {m: ref[m] for m in after} == after
        page.get_by_role("button", name="fit").click()
        again = _module_pixels(page, gpt2_joint)
        common = set(before) & set(again)
        assert len(common) >= 5 and {m: again[m] for m in common} == {m: before[m] for m in common}
    assert errors.errors == [], errors.errors


@pytest.mark.slow
def test_search_at_50k_nodes_steps_with_readable_labels(tmp_path):
    """The bench's 385-layer GPT-2 (~50k nodes; cached by ``bench/bench_dagview.py``)."""
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "bench"))
    from bench_dagview import BIG_LAYERS, deep_joint

    from jointlab.viz.dagview import dag_view

    chromium_path()
    big = deep_joint(BIG_LAYERS)
    want = _matches(big, "gelu_backward")
    assert len(want) == BIG_LAYERS
    path = dag_view(big).write_html(tmp_path / "big.html")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with browser() as b:
        page, errors = _open(b, path)
        _step_through(page, "gelu_backward", want, _full_labels(big), steps=4,
                      shot="big_gelu_backward.png")
    assert errors.errors == [], errors.errors


def _on_screen_nodes(page) -> int:
    return page.evaluate(f"""() => {{ const v = {VIEW}, c = v.canvas; let on = 0;
        for (const i of v.visNodes) {{ const [sx, sy] = v.toScreen(v.x[i], v.y[i]);
            if (sx >= 0 && sy >= 0 && sx <= c.clientWidth && sy <= c.clientHeight) on++; }}
        return on; }}""")


def test_opens_labelled_and_a_group_popup_closes_when_the_view_changes(gpt2_joint, tmp_path):
    from jointlab.viz.dagview import dag_view

    chromium_path()
    path = dag_view(gpt2_joint).write_html(tmp_path / "gpt2.html")
    with browser() as b:
        page, errors = _open(b, path)
        s = _settle(page)
        on = _on_screen_nodes(page)
        # the view opens at a zoom where nodes are labelled: most nodes on screen carry one
        assert s["visibleNodes"] == len(gpt2_joint.graph.nodes) and on >= 40
        # (12 px a row: FIRST_K in static/dag_common.js; labels are placed by room, not zoom)
        assert s["k"] >= 12 and s["labelCount"] >= 0.6 * on, (s["k"], s["labelCount"], on)
        popup = page.locator(".jl-detail")

        def open_popup():
            page.get_by_role("button", name="collapse all").click()
            xy = page.evaluate(f"""() => {{ const v = {VIEW}, r = v.canvas.getBoundingClientRect();
                const b = v.visBoxes[0], q = v.boxRect(b), [sx, sy] = v.toScreen(
                    (q[0] + q[2]) / 2, (q[1] + q[3]) / 2); return [r.left + sx, r.top + sy]; }}""")
            page.mouse.click(*xy)
            assert popup.is_visible() and popup.locator("button").text_content() == "close group"

        open_popup()
        page.fill(".jl-search", "addmm")
        page.press(".jl-search", "Enter")
        assert not popup.is_visible(), "a search closes the group popup"
        open_popup()
        box = page.locator(".jl-canvas").bounding_box()
        page.mouse.move(box["x"] + 100, box["y"] + 100)
        page.mouse.wheel(0, 200)
        assert not popup.is_visible(), "zooming closes the group popup"
    assert errors.errors == [], errors.errors


# The stepper panel's DAG (widgets/_dagcursor.py) in a plain page: its anywidget module is
# rendered with a minimal stand-in for the widget model (get/set/on/off/save_changes).
PANEL_PAGE = """<!DOCTYPE html><html><head><meta charset='utf-8'></head>
<body style='margin:8px;width:900px'><div id='host'></div>
<script type='application/json' id='state'>__STATE__</script>
<script type='module'>
const state = JSON.parse(document.getElementById('state').textContent), handlers = {};
const model = {get: k => state[k], set: (k, v) => { state[k] = v; }, save_changes() {},
  on: (e, f) => { (handlers[e] = handlers[e] || []).push(f); },
  off: (e, f) => { handlers[e] = (handlers[e] || []).filter(g => g !== f); }};
window.__setTrait = (k, v) => { state[k] = v; for (const f of handlers['change:' + k] || []) f(); };
const src = document.getElementById('esm').textContent;
const mod = await import(URL.createObjectURL(new Blob([src], {type: 'text/javascript'})));
mod.default.render({model, el: document.getElementById('host')});
</script><script type='text/plain' id='esm'>__ESM__</script></body></html>"""


def _panel_page(path: pathlib.Path, joint) -> pathlib.Path:
    import json

    from jointlab.widgets._dagcursor import DagCursor

    w = DagCursor(joint)
    state = {k: getattr(w, k) for k in ("payload", "current", "selected", "hidden", "depth",
                                         "values", "own_search", "css_class", "height")}
    text = json.dumps(state).replace("<", "\\u003c")
    path.write_text(PANEL_PAGE.replace("__STATE__", text).replace(
        "__ESM__", w._esm.replace("</script", "<\\/script")), encoding="utf-8")
    return path


def test_stepper_panel_shows_the_current_node_and_its_twin_labelled(gpt2_joint, tmp_path):
    import jointlab as jl

    chromium_path()
    labels = _full_labels(gpt2_joint)
    nodes = list(gpt2_joint.graph.nodes)
    # a forward op in a block with a backward twin, a parameter, and a backward op
    fwd = next(n for n in nodes if jl.meta.op_name(n) == "addmm" and jl.meta.is_forward(n)
               and any(jl.meta.info(m).get("fwd_twin") == n.name for m in nodes))
    twins = [m.name for m in nodes if jl.meta.info(m).get("fwd_twin") == fwd.name]
    param = next(n for n in nodes if jl.meta.phase(n) == "param"
                 and jl.meta.info(n).get("fqn", "").endswith("ln_1.weight"))
    bwd = next(n for n in nodes if jl.meta.op_name(n) == "native_layer_norm_backward")
    path = _panel_page(tmp_path / "panel.html", gpt2_joint)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with browser() as b:
        page, errors = open_dag_page(
            b, path, width=1000, height=600,
            drawn="() => { const d = document.querySelector('.jl-dag');"
                  " return d && d.dataset.ready && d.jlView.lastFrameMs >= 0 }")
        for node, want in ((fwd, [fwd.name, *twins]), (bwd, [bwd.name, jl.meta.info(bwd)[
                "fwd_twin"]]), (param, [param.name])):
            page.evaluate(f"() => window.__setTrait('current', {node.name!r})")
            s = _settle(page)
            _assert_readable(s, want, labels, f"panel at {node.name}")
            # no group title over the ringed node or its label
            box = page.evaluate(f"""() => {{ const v = {VIEW}, i = v.index.get({node.name!r});
                const [sx, sy] = v.toScreen(v.x[i], v.y[i]), r = v._radius() + 4;
                return {{node: [sx - r, sy - r, sx + r, sy + r],
                         titles: v.titles.map(t => t.slice(1, 5))}}; }}""")
            mine = [box["node"]] + [p["rect"] for p in s["pinned"] if p["name"] == node.name]
            for t in box["titles"]:
                for r in mine:
                    assert not (t[0] < r[2] and r[0] < t[2] and t[1] < r[3] and r[1] < t[3]), \
                        (node.name, t, r)
            if node is fwd:
                page.screenshot(path=str(SHOTS / "stepper_panel.png"))
        # no group title is ever drawn over the ringed node, wherever it sits in its group
        for node in nodes:
            if not jl.meta.module(node).startswith("transformer.h.0"):
                continue
            page.evaluate(f"() => window.__setTrait('current', {node.name!r})")
            _settle(page)
            # panned up to the canvas' top edge, where open groups keep their titles in view
            hit = page.evaluate(f"""() => {{ const v = {VIEW}, i = v.index.get({node.name!r});
                v.vy = v.y[i] + 12 / (v.k * v.ay); v.render();
                const [sx, sy] = v.toScreen(v.x[i], v.y[i]), r = v._radius() + 4;
                return v.titles.filter(t => t[1] < sx + r && sx - r < t[3] && t[2] < sy + r
                                            && sy - r < t[4]).length; }}""")
            assert hit == 0, node.name
        # a parameter is named by its FQN in the canvas label and in the detail panel
        assert labels[param.name] == jl.meta.info(param)["fqn"] != param.name
        page.evaluate(f"() => {VIEW}.select({VIEW}.index.get({param.name!r}))")
        name = page.locator(".jl-detail .jl-detail-name").text_content()
        assert name == jl.meta.info(param)["fqn"], name
        page.screenshot(path=str(SHOTS / "stepper_panel_param.png"))
    assert errors.errors == [], errors.errors


def test_diff_view_marks_changes_and_shows_old_and_new_arguments(tmp_path):
    import jointlab as jl
    from jointlab.viz.diff import DIFF_COLORS
    from tests.fixtures import zoo
    from tests.test_diff import tanh_gelu

    chromium_path()
    f = zoo.get("mlp")
    a = jl.trace(f.make_model(), f.train_fn, f.make_inputs(4))
    b = jl.trace(f.make_model(), f.train_fn, f.make_inputs(4))
    gelus = tanh_gelu(b)  # the reference: what the pass changed, and how
    path = jl.plot_diff(jl.diff(a, b), a, b).write_html(tmp_path / "diff.html")
    labels = _full_labels(b)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with browser() as bw:
        page, errors = _open(bw, path)
        s = _settle(page)
        assert page.locator(".jl-count").text_content() == f"1 of {len(gelus)}"
        for k, name in enumerate(gelus):
            if k:
                page.locator(".jl-next").click()
                s = _settle(page)
            assert s["current"] == name
            _assert_readable(s, [name], labels, "diff")
            # marked in the change colour on the canvas
            page.evaluate(f"() => {{ const v = {VIEW}; v.current = -1; v.hits = new Set();"
                          " v.render(); }")
            assert _pixel(page, name) == DIFF_COLORS["changed"]
            # its detail panel, opened by a click on it, gives the old and new argument
            xy = page.evaluate(f"""() => {{ const v = {VIEW}, i = v.P.nodes.name.indexOf({name!r});
                const r = v.canvas.getBoundingClientRect(), [sx, sy] = v.toScreen(v.x[i], v.y[i]);
                return [r.left + sx, r.top + sy]; }}""")
            page.mouse.click(*xy)
            rows = dict(page.evaluate(
                "() => [...document.querySelectorAll('.jl-detail td.jl-note')]"
                ".map(td => [td.previousSibling.textContent, td.textContent])"))
            assert rows["approximate"] == "none -> tanh", rows
            assert rows["what changed"] == "args", rows
            if k == 0:
                page.screenshot(path=str(SHOTS / "diff_view.png"))
        same = next(n.name for n in b.graph.nodes if jl.meta.op_name(n) == "relu")
        assert _pixel(page, same) in (DIFF_COLORS["same"], None)
    assert errors.errors == [], errors.errors
