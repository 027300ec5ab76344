"""First views of ``jl.dag_view`` on real models in headless Chromium, read from the page.

Issue 43, items 2-5: the lesson MLP (notebook 05), tiny HF Falcon and GPT-J, a U-Net
written here (conv/BN/ReLU, max-pool down, transposed-conv up, skip connections) and a
tensor-parallel graph with collectives (``jl.fake_world``, as notebook 06) open with
whole labels on their key ops, no two labels overlapping; a group's popup never covers
what it opened; keys typed in the view never reach the page. Widths: the output area a
JupyterLab window 1280 and 1024 px wide gives a cell (1150 and 894 px). Key ops are
chosen here from the graph (category and op name), not from the renderer's priorities.
Screenshots go to ``$JOINTLAB_DAG_SHOTS`` (default ``/tmp/dag_shots``).
"""

from __future__ import annotations

import os
import pathlib

import pytest

from tests.chromium import browser, chromium_path, code_notebook, open_dag_page
from tests.fixtures.view_models import (
    collective_view,
    falcon_joint,
    gptj_joint,
    lesson_joint,
    unet_joint,
)
from tests.test_browser import lab  # noqa: F401 - the JupyterLab server fixture
from tests.util import NEEDS_DISTRIBUTED_TORCH

pytestmark = pytest.mark.browser
SHOTS = pathlib.Path(os.environ.get("JOINTLAB_DAG_SHOTS", "/tmp/dag_shots"))
VIEW = "document.querySelector('.jl-dag').jlView"
OUTPUT_WIDTH = {1280: 1150, 1024: 894}  # a notebook cell's output area at that window width
KEY_CATEGORIES = {"matmul", "conv", "norm", "collective"}


def key_ops(joint) -> dict[str, str]:
    """The ops a reader looks for, by name: matmuls, convolutions, norms, collectives, losses."""
    import jointlab as jl
    from jointlab.viz.dagview import node_label

    out = {}
    for n in joint.graph.nodes:
        m = jl.meta.info(n)
        label = node_label(n, m)
        if n.op == "call_function" and (m.get("category") in KEY_CATEGORIES or "loss" in label):
            out[n.name] = label
    return out


def full_labels(joint) -> dict[str, str]:
    import jointlab as jl
    from jointlab.viz.dagview import node_label

    return {n.name: node_label(n, jl.meta.info(n)) for n in joint.graph.nodes}


# What the page drew: every node label, pinned label and group title with its screen rect,
# each labelled node's disc, and the mini view's rect while it shows.
DRAWN = f"""() => {{ const v = {VIEW}, s = v.state(), r = v._radius();
    const disc = {{}};
    for (const i of v.visNodes) {{ const [x, y] = v.toScreen(v.x[i], v.y[i]);
        disc[v.P.nodes.name[i]] = [x, y]; }}
    const m = v.mini, W = v.canvas.clientWidth, H = v.canvas.clientHeight;
    return {{s, disc, r, W, H, mini: s.miniShown ? [W - m.width - 8, H - m.height - 8, W, H] : null,
             rects: [...s.labelRects.map(l => [l.text, l.rect]),
                     ...s.pinned.map(p => [p.text, p.rect]),
                     ...s.titleTexts.map(t => [t.text, t.rect])]}}; }}"""


def _overlap(a, b) -> bool:
    return a[0] < b[2] - 0.5 and b[0] < a[2] - 0.5 and a[1] < b[3] - 0.5 and b[1] < a[3] - 0.5


def assert_labels_whole_and_apart(d: dict, labels: dict[str, str], what: str) -> None:
    """Each node label is its node's whole label (or a dotted name cut in the middle, its last
    part kept), sits on its node, lies inside the canvas; no two drawn texts overlap."""
    for lr in d["s"]["labelRects"]:
        full, text, (x0, y0, x1, y1) = labels[lr["name"]], lr["text"], lr["rect"]
        assert lr["full"] == full, (what, lr)
        if text != full:  # elided: a dotted name, head and last part kept
            last = full.rsplit(".", 1)[-1]
            assert "." in full and "…" in text and text.endswith(last), (what, text, full)
            head = text.split("…")[0]
            assert full.startswith(head) and len(text) < len(full), (what, text, full)
        sx, sy, r = *d["disc"][lr["name"]], d["r"]
        inset = min(r, (x1 - x0) / 2) - 0.5
        above_below = (x0 + inset <= sx <= x1 - inset) and (
            sy - r - 14 <= y1 <= sy - r + 0.5 or sy + r - 0.5 <= y0 <= sy + r + 2)
        beside = y0 <= sy <= y1 and (sx + r <= x0 <= sx + r + 4 or sx - r - 4 <= x1 <= sx - r)
        assert above_below or beside, (what, lr, sx, sy)  # next to its own node
        assert 0 <= x0 and x1 <= d["W"] and 0 <= y0 and y1 <= d["H"], (what, lr)
    for t in d["s"]["titleTexts"]:  # a module name is never cut from the left
        name = t["text"].removesuffix(" ▾").removesuffix(" (bwd)")
        assert name and not name.startswith("…"), (what, t)
    rects = d["rects"] + ([["mini view", d["mini"]]] if d["mini"] else [])
    for k, (ta, ra) in enumerate(rects):
        for tb, rb in rects[k + 1:]:
            assert not _overlap(ra, rb), (what, ta, ra, tb, rb)
    node_rects = [lr["rect"] for lr in d["s"]["labelRects"]]  # and never run together
    for k, a in enumerate(node_rects):
        for b in node_rects[k + 1:]:
            gap = max(a[0] - b[2], b[0] - a[2])
            assert gap >= 2 or a[1] >= b[3] or b[1] >= a[3], (what, a, b)


def on_screen(d: dict, name: str) -> bool:
    """The node's disc is inside the canvas with room for a label, and not under the mini view."""
    if name not in d["disc"]:
        return False
    x, y = d["disc"][name]
    m = d["mini"]
    if m and m[0] - 2 <= x and m[1] - 14 <= y:
        return False
    return 12 <= x <= d["W"] - 12 and 16 <= y <= d["H"] - 16


def _open(b, path, width: int, height: int = 600):
    return open_dag_page(b, path, width=OUTPUT_WIDTH[width] + 16, height=height, timeout=120_000)


def _settle(page) -> None:
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


MODELS = {"lesson_mlp": lesson_joint, "hf_falcon": falcon_joint, "hf_gptj": gptj_joint,
          "unet": unet_joint, "tp_collectives": None}


def _view_page(name: str, root: pathlib.Path):
    """The model's joint graph and its dag_view page (the collective one as notebook 06's)."""
    from jointlab.viz.dagview import dag_view

    if name == "tp_collectives":
        joint, view = collective_view()
    else:
        joint = MODELS[name]()
        view = dag_view(joint)
    return joint, view.write_html(root / f"{name}.html")


@pytest.mark.parametrize("name", [pytest.param(n, marks=NEEDS_DISTRIBUTED_TORCH)
                                  if n == "tp_collectives" else n for n in MODELS])
def test_first_view_shows_key_ops_whole_and_no_two_labels_overlap(name, tmp_path):
    """The model's first view, at both widths: the key ops on screen carry their whole label,
    every drawn label is whole (or a dotted name cut in the middle) and on its node, and no
    two texts (node labels, pinned labels, group titles, the mini view) overlap."""
    chromium_path()
    SHOTS.mkdir(parents=True, exist_ok=True)
    joint, path = _view_page(name, tmp_path)
    labels, keys = full_labels(joint), key_ops(joint)
    with browser() as b:
        for width in OUTPUT_WIDTH:
            page, errors = _open(b, path, width)
            _settle(page)
            page.screenshot(path=str(SHOTS / f"first_view_{name}_{width}.png"))
            d = page.evaluate(DRAWN)
            what = f"{name} at {width}"
            assert_labels_whole_and_apart(d, labels, what)
            whole = {lab["name"] for lab in d["s"]["labelRects"] if lab["text"] == lab["full"]}
            shown = [k for k in keys if on_screen(d, k)]
            assert len(shown) >= 2, (what, len(shown))  # it opens where key ops are drawn
            missing = [(k, keys[k]) for k in shown if k not in whole]
            assert not missing, (what, missing, len(shown))
            assert errors.errors == [], errors.errors
            page.close()


def test_lesson_mlp_opens_whole_with_every_name_the_lesson_teaches(tmp_path):
    """Notebook 05's view (height 440): every node and both loss-side titles on screen, each
    label whole (fc1.bias, fc2.bias, tanh_backward, mse_loss_backward, <train_fn>), no mini
    view over the backward band, at both widths."""
    from jointlab.viz.dagview import dag_view

    chromium_path()
    joint = lesson_joint()
    labels = full_labels(joint)
    path = dag_view(joint, height=440).write_html(tmp_path / "lesson.html")
    with browser() as b:
        # 570 px: JupyterLab at 1024 with its file browser open; the last page opens wide and
        # is narrowed (the view is fitted again while the user has not moved it)
        for width, first in ((1280, 1280), (1024, 1024), (570, 1280)):
            page, errors = open_dag_page(b, path, width=OUTPUT_WIDTH.get(first, first) + 16,
                                         height=600, timeout=120_000)
            page.set_viewport_size({"width": OUTPUT_WIDTH.get(width, width) + 16, "height": 600})
            _settle(page)
            page.screenshot(path=str(SHOTS / f"lesson_mlp_{width}.png"))
            d = page.evaluate(DRAWN)
            what = f"lesson at {width}"
            assert_labels_whole_and_apart(d, labels, what)
            assert set(d["disc"]) == set(labels) and all(on_screen(d, k) for k in labels), what
            drawn = {lab["name"]: lab["text"] for lab in d["s"]["labelRects"]}
            assert drawn == labels, (what, {k: v for k, v in labels.items() if drawn.get(k) != v})
            titles = {t["text"] for t in d["s"]["titleTexts"]}
            assert {"<train_fn> ▾", "<train_fn> (bwd) ▾", "fc1 ▾", "fc2 (bwd) ▾"} <= titles, titles
            assert d["mini"] is None, what  # everything is in view: no mini view over it
            assert errors.errors == [], errors.errors
            page.close()


# Screen rects (page pixels) of the popup and of everything drawn for group `name` (its
# nodes' discs, its closed subgroups' boxes, its outlines), both bands.
GROUP_AND_POPUP = f"""name => {{ const v = {VIEW}, c = v.canvas.getBoundingClientRect();
    const g = v.P.groups.name.indexOf(name), inside = h => {{ for (; h >= 0; h = v.parent[h])
        if (h === g) return true; return false; }}, r = v._radius(), out = [];
    const add = (a, t, z, u) => out.push([c.left + a, c.top + t, c.left + z, c.top + u]);
    for (const i of v.visNodes) if (inside(v.g[i])) {{ const [x, y] = v.toScreen(v.x[i], v.y[i]);
        add(x - r, y - r, x + r, y + r); }}
    for (const b of v.visBoxes) if (inside(b >> 1)) {{ const q = v.boxRect(b);
        const [a, t] = v.toScreen(q[0], q[3]), [z, u] = v.toScreen(q[2], q[1]); add(a, t, z, u); }}
    for (const b of [0, 1]) {{ const q = v.outlineRect(g * 2 + b); if (!q) continue;
        const [a, t] = v.toScreen(q[0], q[3]), [z, u] = v.toScreen(q[2], q[1]); add(a, t, z, u); }}
    const p = v.detail.getBoundingClientRect(), shown = v.detail.style.display !== 'none';
    return {{items: out, popup: shown ? [p.left, p.top, p.right, p.bottom] : null,
             canvas: [c.left, c.top, c.right, c.bottom]}}; }}"""

# Per word of the popup's text, how many line boxes it is drawn on (2: broken mid-word).
WORD_LINES = """() => { const out = [], w = document.createTreeWalker(
        document.querySelector('.jl-detail'), NodeFilter.SHOW_TEXT);
    for (let t = w.nextNode(); t; t = w.nextNode()) {
        const re = /\\S+/g; let m;
        while ((m = re.exec(t.data))) { const r = document.createRange();
            r.setStart(t, m.index); r.setEnd(t, m.index + m[0].length);
            const tops = new Set([...r.getClientRects()].map(q => Math.round(q.top)));
            out.push([m[0], tops.size]); } }
    return out; }"""


def _box_centre(page, name: str, band: int = 0) -> list[float]:
    return page.evaluate(f"""() => {{ const v = {VIEW}, c = v.canvas.getBoundingClientRect();
        const q = v.boxRect(v.P.groups.name.indexOf({name!r}) * 2 + {band});
        const [x, y] = v.toScreen((q[0] + q[2]) / 2, (q[1] + q[3]) / 2);
        return [c.left + x, c.top + y]; }}""")


def test_a_group_popup_never_covers_what_it_opened_nor_breaks_words(tmp_path):
    """Falcon, everything closed, at both widths: click the ``transformer`` box; the popup
    lies clear of every disc, box and outline of the opened group, no word in it is broken
    across lines, and a click on a new child box opens that child (not the popup)."""
    from jointlab.viz.dagview import dag_view

    chromium_path()
    joint = falcon_joint()
    path = dag_view(joint).write_html(tmp_path / "falcon.html")
    with browser() as b:
        for width in OUTPUT_WIDTH:
            page, errors = _open(b, path, width)
            page.get_by_role("button", name="collapse all").click()
            page.mouse.click(*_box_centre(page, "transformer"))
            _settle(page)
            got = page.evaluate(GROUP_AND_POPUP, "transformer")
            page.screenshot(path=str(SHOTS / f"popup_falcon_{width}.png"))
            assert got["popup"] is not None and len(got["items"]) > 5, got
            for it in got["items"]:
                assert not _overlap(got["popup"], it), (width, got["popup"], it)
            words = page.evaluate(WORD_LINES)
            assert len(words) > 8 and all(n == 1 for _, n in words), words
            # a node's popup too (its source line and module wrap): words of up to 30
            # characters are never broken (a longer one, a path, may be where it overflows)
            page.evaluate(f"() => {VIEW}.select({VIEW}.P.nodes.name.indexOf('native_layer_norm'))")
            words = page.evaluate(WORD_LINES)
            broken = [w for w, n in words if n > 1 and len(w) <= 30]
            assert len(words) > 30 and not broken, broken
            page.evaluate(f"() => {VIEW}.toggle({VIEW}.P.groups.name.indexOf('transformer'), "
                          "true, 0)")  # its group popup again
            # the next click goes to a new child drawn on the canvas
            child = page.evaluate(f"""() => {{ const v = {VIEW};
                const b = v.visBoxes.find(b => v.P.groups.name[b >> 1] === 'transformer.h');
                return b === undefined ? null : v.P.groups.name[b >> 1]; }}""")
            assert child == "transformer.h"
            page.mouse.click(*_box_centre(page, child))
            _settle(page)
            assert page.evaluate(f"() => {VIEW}.expanded[{VIEW}.P.groups.name"
                                 ".indexOf('transformer.h')]") == 1
            assert errors.errors == [], errors.errors
            page.close()


# Put node `name` at canvas point (x, y) (fractions of the canvas) at a readable zoom; return
# its disc's centre in page pixels and the ring's radius (the ring is drawn at r + 4, 3 px wide).
PUT_NODE = f"""([name, fx, fy]) => {{ const v = {VIEW}, c = v.canvas.getBoundingClientRect();
    const i = v.P.nodes.name.indexOf(name), W = v.canvas.clientWidth, H = v.canvas.clientHeight;
    v.selected = -1;
    v.k = 30; v.ay = 1; v.vx = v.x[i] - fx * W / v.k; v.vy = v.y[i] + fy * H / v.k; v.render();
    const [x, y] = v.toScreen(v.x[i], v.y[i]);
    return [c.left + x, c.top + y, v._radius() + 5.5]; }}"""


def test_a_node_popup_never_covers_its_node(tmp_path):
    """The lesson MLP at both widths: a node moved near each corner of the canvas and to its
    centre, then clicked, opens its popup clear of the node's disc and ring; a click on the
    same point hits the canvas (the node again), not the popup."""
    from jointlab.viz.dagview import dag_view

    chromium_path()
    joint = lesson_joint()
    path = dag_view(joint).write_html(tmp_path / "lesson.html")
    spots = {"top_right": (0.9, 0.12), "top_left": (0.1, 0.12),  # bottom right: above the mini view
             "bottom_right": (0.9, 0.78), "bottom_left": (0.1, 0.88), "centre": (0.5, 0.5)}
    with browser() as b:
        for width in OUTPUT_WIDTH:
            page, errors = _open(b, path, width)
            for where, (fx, fy) in spots.items():
                x, y, r = page.evaluate(PUT_NODE, ["mm", fx, fy])
                page.mouse.click(x, y)
                _settle(page)
                if where == "top_right":
                    page.screenshot(path=str(SHOTS / f"node_popup_{width}.png"))
                p = page.evaluate("() => { const d = document.querySelector('.jl-detail');"
                                  " const q = d.getBoundingClientRect(); return"
                                  " d.style.display === 'none' ? null :"
                                  " [q.left, q.top, q.right, q.bottom]; }")
                assert p is not None, (width, where)
                assert page.evaluate(f"() => {VIEW}.P.nodes.name[{VIEW}.selected]") == "mm"
                node = [x - r, y - r, x + r, y + r]
                assert not _overlap(p, node), (width, where, p, node)
                assert page.evaluate("([x, y]) => document.elementFromPoint(x, y).className",
                                     [x, y]) == "jl-canvas", (width, where)
                page.locator(".jl-detail .jl-link").first.click()  # its ✕: closed again
            assert errors.errors == [], errors.errors
            page.close()


# Key events the document hears (JupyterLab listens there, in the bubble phase).
DOC_KEYS = """window.__docKeys = [];
for (const t of ['keydown', 'keypress', 'keyup'])
    document.addEventListener(t, e => window.__docKeys.push(t + ':' + e.key));"""


def test_keys_typed_in_the_view_never_reach_the_document(tmp_path):
    """Enter / Shift+Enter in the search box step through the hits and the document hears
    none of them (a key pressed outside the view still reaches it)."""
    from jointlab.viz.dagview import dag_view

    chromium_path()
    joint = lesson_joint()
    path = dag_view(joint).write_html(tmp_path / "lesson.html")
    with browser() as b:
        page, errors = open_dag_page(b, path, init=DOC_KEYS, width=910, height=600)
        assert page.get_attribute(".jl-dag", "data-lm-suppress-shortcuts") == "true"
        page.fill(".jl-search", "mm")
        page.press(".jl-search", "Enter")
        page.press(".jl-search", "Enter")
        assert page.locator(".jl-count").text_content().startswith("2 of ")
        page.press(".jl-search", "Shift+Enter")
        assert page.locator(".jl-count").text_content().startswith("1 of ")
        page.keyboard.type("x")
        assert page.evaluate("() => window.__docKeys") == []
        page.evaluate("() => document.activeElement.blur()")
        page.keyboard.press("Shift+Enter")  # outside the view: heard
        assert "keydown:Enter" in page.evaluate("() => window.__docKeys")
        assert errors.errors == [], errors.errors


LESSON_CELL = '''import torch, torch.nn as nn, torch.nn.functional as F
import jointlab as jl


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


torch.manual_seed(0)
joint = jl.trace(MLP(), lambda m, x, y: F.mse_loss(m(x), y),
                 {"x": torch.randn(5, 3), "y": torch.randn(5, 1)})
jl.dag_view(joint, height=440)'''


def test_shift_enter_in_the_search_box_does_not_run_the_cell_in_jupyterlab(lab, tmp_path):  # noqa: F811
    """JupyterLab at 1024x768: Enter, Enter, Shift+Enter in the view's search box step
    through the hits; the cell is not run again (its prompt stays [1], no cell is added)
    and the view is the same element, its search kept."""
    from tests.test_browser import _open_and_run_all

    src = code_notebook(tmp_path / "keys.ipynb", [LESSON_CELL])
    with browser() as b:
        page, errors = _open_and_run_all(lab, b, "keys", src=src, min_cells=1)
        page.set_viewport_size({"width": 1024, "height": 768})
        page.wait_for_function("() => { const d = document.querySelector('.jl-dag');"
                               " return d && d.jlView && d.jlView.lastFrameMs >= 0 }")
        page.evaluate("() => { document.querySelector('.jl-dag').dataset.tag = 'first'; }")
        search = page.locator(".jl-dag .jl-search")
        search.click()
        search.type("mm")
        search.press("Enter")
        search.press("Enter")
        count = page.locator(".jl-dag .jl-count")
        assert count.text_content().startswith("2 of ")
        search.press("Shift+Enter")
        page.wait_for_timeout(1500)  # time for a run the key might have started
        page.screenshot(path=str(SHOTS / "jupyterlab_shift_enter_1024.png"))
        prompts = page.eval_on_selector_all(".jp-CodeCell .jp-InputPrompt",
                                            "ps => ps.map(p => p.textContent.trim())")
        assert prompts == ["[1]:"], prompts
        assert page.locator(".jl-dag[data-tag='first']").count() == 1  # not rebuilt
        assert count.text_content().startswith("1 of ") and search.input_value() == "mm"
        assert errors.errors == [], errors.errors
