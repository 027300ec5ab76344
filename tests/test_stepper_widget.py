"""Stepper panel: buttons drive the stepper, labels and inspector follow it."""

from __future__ import annotations

import copy
import re

import ipywidgets as W  # noqa: E402, F401
import pytest
import torch

import jointlab as jl
from tests.fixtures import zoo
from tests.test_browser import lab  # noqa: F401 - the JupyterLab server fixture


@pytest.fixture()
def panel():
    f = zoo.FIXTURES["mlp"]
    model, inputs = f.make_model(), f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs)
    s = jl.Stepper(joint, model, inputs, device="cpu", seed=0)
    return s, s.widget(train_fn=f.train_fn), f, model, inputs


def test_step_button_moves_the_position_label(panel):
    s, w, *_ = panel
    assert w.position_label.value == f"position 0 / {len(s.nodes)}"
    w.buttons["step"].click()
    w.buttons["step"].click()
    assert s.position == 2 and w.position_label.value.startswith("position 2 /")
    assert w.buttons["step"].description == "Step"


def test_inspector_shows_stats_of_the_stepped_value(panel):
    s, w, f, model, inputs = panel
    while s.current.name != "addmm":
        w.buttons["step"].click()
    w.buttons["step"].click()
    want = torch.nn.functional.linear(inputs["x"], model.fc1.weight, model.fc1.bias).detach()
    page = w.inspector.value
    assert "addmm" in page and "(4, 32) float32" in page
    for stat in (want.min(), want.max(), want.mean(), want.std(correction=0)):
        assert f">{float(stat):.4g}<" in page  # 4 significant digits, from eager's own values
    assert not re.search(r"\d\.\d{7,}", page)  # never 17 digits
    assert "jl-hist" in page


def _chips(w) -> list[str]:
    return [c.description for c in w.chips.box.children]


def test_breakpoint_editor_continue_and_reset(panel):
    s, w, *_ = panel
    editor = w.children[3].children
    editor[0].value, editor[1].value = "module", "fc3"
    w.buttons["add"].click()
    w.buttons["continue"].click()
    assert s.current.meta["jointlab"]["module"] == "fc3"
    assert _chips(w) == ["module fc3  \u2715"]  # a readable chip, not a repr
    w.buttons["continue"].click()  # next fc3 node (forward addmm, then backward ones)
    assert s.current.meta["jointlab"]["module"] == "fc3"
    w.buttons["clear"].click()
    w.buttons["continue"].click()
    assert s.done and "done" in w.current.value
    w.buttons["reset"].click()
    assert s.position == 0 and w.position_label.value.startswith("position 0 /")


def _module(node) -> str:
    return node.meta["jointlab"].get("module", "")


def test_step_over_module_and_compare_table(panel):
    s, w, *_ = panel
    while _module(s.current) != "fc1":
        w.buttons["step"].click()
    before = s.position
    # independent reference: the first later node outside fc1 (and its submodules)
    inside = [_module(n) == "fc1" or _module(n).startswith("fc1.") for n in s.nodes]
    want = next(i for i in range(before, len(s.nodes)) if not inside[i])
    assert want - before >= 2  # fc1's forward is several nodes: a plain Step would stop sooner
    w.buttons["over"].click()
    assert s.position == want and _module(s.current) != "fc1"
    assert w.position_label.value.startswith(f"position {want} /")
    w.buttons["compare"].click()  # "Compare with eager"
    verdict = "compared with eager autograd: <span class='jl-ok'>bit-exact</span>"
    assert verdict in w.compare_box.value


def test_dag_ring_follows_the_current_node(panel):
    s, w, *_ = panel
    cursor = w.dag
    assert cursor is not None and cursor in w.children
    assert list(cursor.payload["nodes"]["name"]) == [n.name for n in s.nodes]  # every node drawn
    for _ in range(3):
        assert cursor.current == s.current.name
        w.buttons["step"].click()
    s.run()
    w.buttons["step"].click()  # at the end: nothing to ring
    assert cursor.current == ""


def test_dag_is_left_out_when_asked():
    f = zoo.FIXTURES["mlp"]
    model, inputs = f.make_model(), f.make_inputs(4)
    s = jl.Stepper(jl.trace(model, f.train_fn, inputs), model, inputs, device="cpu")
    assert s.widget(dag=False).dag is None


def test_breakpoint_chips_are_removed_one_by_one(panel):
    s, w, *_ = panel
    editor = w.children[3].children
    for kind, text in (("module", "fc2"), ("op", "relu"), ("module", "fc3")):
        editor[0].value, editor[1].value = kind, text
        w.buttons["add"].click()
    assert _chips(w) == ["module fc2  \u2715", "op relu  \u2715", "module fc3  \u2715"]
    w.chips.box.children[1].click()  # remove "op relu" only
    assert _chips(w) == ["module fc2  \u2715", "module fc3  \u2715"]
    assert [(b.module, b.op) for b in s.breakpoints] == [("fc2", None), ("fc3", None)]
    w.chips.box.children[0].click()
    w.buttons["continue"].click()  # the remaining breakpoint still stops
    assert s.current.meta["jointlab"]["module"] == "fc3" and _chips(w) == ["module fc3  \u2715"]


def test_editor_refuses_a_breakpoint_that_matches_nothing(panel):
    s, w, *_ = panel
    editor = w.children[3].children
    editor[0].value, editor[1].value = "op", "gelu_bakward"
    w.buttons["add"].click()
    assert s.breakpoints == [] and _chips(w) == []
    assert "would never stop" in w.message.value and "gelu_backward" in w.message.value


def test_current_node_is_readable(panel):
    s, w, f, model, inputs = panel
    while s.current.name != "addmm":
        w.buttons["step"].click()
    node = s.current
    card = w.current.value
    assert "%addmm" not in card and "num_users" not in card  # not the raw FX string
    assert "addmm" in card and "fc1" in card and "Linear" in card and "forward" in card
    # input and output shapes against the eager tensors they are
    for t in (model.fc1.bias, inputs["x"]):
        assert f"({', '.join(map(str, t.shape))}) float32" in card
    assert "(4, 32) float32" in card
    assert "x = F.gelu(self.fc1(x))" in card  # the user's source line, from the file
    backward = [n.name for n in s.nodes if n.meta["jointlab"].get("fwd_twin") == node.name]
    assert backward and all(b in card for b in backward[:3])
    bwd = next(n for n in s.nodes if n.meta["jointlab"].get("fwd_twin") == "gelu")
    s.run_to(s.nodes.index(bwd))  # a backward node names its forward twin
    w.buttons["inspect"].click()  # refresh without moving
    assert s.current is bwd
    assert "forward twin <code>gelu</code>" in w.current.value and "backward" in w.current.value


def test_compare_shows_first_divergence_on_top_and_reset_clears_it():
    f = zoo.FIXTURES["mlp"]
    model, inputs = f.make_model(), f.make_inputs(4)
    buggy = jl.trace(model, f.train_fn, inputs)
    relu = next(n for n in buggy.graph.nodes if n.target is torch.ops.aten.relu.default)
    relu.target = torch.ops.aten.sigmoid.default  # forward changed, backward left alone
    buggy.recompute()
    s = jl.Stepper(buggy, model, inputs, device="cpu", seed=0)
    w = s.widget(train_fn=f.train_fn, dag=False)
    w.buttons["compare"].click()
    box = w.compare_box.value
    assert "MISMATCH" in box and "jl-bad" in box
    assert box.index("first divergence") < box.index("worst gradients")
    first = jl.compare(buggy, model, inputs, seed=0).first_divergence  # fc3: first probed output
    assert first is not None and f"<code>{first.node}</code>" in box.split("worst gradients")[0]
    assert not re.search(r"\d\.\d{7,}", box)
    w.buttons["reset"].click()
    assert w.compare_box.value == ""


def _cells(page: str) -> dict[str, str]:
    """``{key: number}`` of the inspector's statistics table."""
    return dict(re.findall(r"<td class='k'>([\w-]+)</td><td class='n'>([^<]*)</td>", page))


def test_record_table_and_stepper_panel_show_the_same_statistics():
    """One value, three views: jl.record's row, the inspector and the DAG detail rows agree.

    The reference for "which std" is numpy's population std of the eager value.
    """
    from jointlab.widgets._stepper_html import fmt

    f = zoo.FIXTURES["mlp"]
    model, inputs = f.make_model(), f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs)
    rec = jl.record(joint, copy.deepcopy(model), inputs)
    s = jl.Stepper(joint, model, inputs, device="cpu", seed=0)
    w = s.widget(dag=True)
    while s.current.name != "addmm":
        w.buttons["step"].click()
    w.buttons["step"].click()  # addmm: a (4, 32) value, where Bessel's factor shows in 4 digits
    want = torch.nn.functional.linear(inputs["x"], model.fc1.weight, model.fc1.bias)
    x = want.detach().double().numpy()
    assert fmt(float(x.std(ddof=0))) != fmt(float(x.std(ddof=1)))  # the test can tell them apart
    row = rec.table.loc["addmm"]
    detail = w.dag.values["addmm"]
    inspector = _cells(w.inspector.value)
    for k in ("mean", "std", "min", "max"):
        assert fmt(float(row[k])) == detail[k] == inspector[k], (k, row[k], detail, inspector)
    assert fmt(float(row["std"])) == fmt(float(x.std(ddof=0)))
    assert fmt(float(row["norm"])) == detail["norm"]
    assert detail["NaN / Inf"] == f"{row['nan']} / {row['inf']}" == "0 / 0"


# -- the panel and the memory plot at projector width, in JupyterLab -----------------------
FIT_CELLS = [
    "import sys; sys.path.insert(0, {repo!r})",
    "import jointlab as jl\nfrom tests.fixtures import zoo\nf = zoo.FIXTURES['tiny_lm']\n"
    "model, inputs = f.make_model(), f.make_inputs(2)\n"
    "joint = jl.trace(model, f.train_fn, inputs)",
    "jl.Stepper(joint, model, inputs, device='cpu', seed=0).widget(train_fn=f.train_fn)",
    "jl.plot_memory(joint.memory(model=model, inputs=inputs))",
]
#: Widgets whose text is cut (ellipsis or hidden overflow): their text is wider than their box.
CLIPPED = """root => [...root.querySelectorAll(
    'button, .widget-label, .widget-label-basic, label, select')]
    .filter(el => el.offsetParent !== null && el.scrollWidth > el.clientWidth + 1)
    .map(el => [el.tagName, el.textContent.trim(), el.scrollWidth, el.clientWidth])"""
#: Bounding boxes (screen px) of the memory plot's legend items, peak label and title.
PLOT_BOXES = """p => { const r = el => { const b = el.getBoundingClientRect();
    return [b.left, b.top, b.right, b.bottom]; };
  return {legend: [...p.querySelectorAll('g.legend-item')].map(r),
          peak: [...p.querySelectorAll('g.peak-label')].map(r),
          other: [...p.querySelectorAll('text.annotation, text.title')].map(r),
          svg: r(p.querySelector('svg'))}; }"""


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.browser
def test_panel_buttons_and_memory_plot_fit_1024_and_1280(lab, tmp_path):  # noqa: F811
    """At 1024 and 1280 wide no button or label of the panel is cut, and the memory plot's
    peak label overlaps neither its legend nor its titles, after each resize."""
    from tests.chromium import browser, code_notebook, save_screenshot
    from tests.test_browser import REPO, _assert_no_error_outputs, _open_and_run_all

    nb = code_notebook(tmp_path / "fit.ipynb", [src.format(repo=str(REPO)) for src in FIT_CELLS])
    with browser() as b:
        page, errors = _open_and_run_all(lab, b, "fit", src=nb, min_cells=4)
        _assert_no_error_outputs(page)
        panel = page.locator(".jl-stepper").first
        panel.wait_for(timeout=60_000)
        plot = page.locator(".jl-plot").first
        plot.wait_for(timeout=60_000)
        for width, height in ((1280, 800), (1024, 768), (1280, 800)):
            page.set_viewport_size({"width": width, "height": height})
            page.wait_for_timeout(800)  # JupyterLab lays out again
            panel.scroll_into_view_if_needed()
            save_screenshot(page, tmp_path, f"stepper_panel_{width}")
            assert panel.locator("button", has_text="Step over module").is_visible()
            assert panel.evaluate(CLIPPED) == [], width
            plot.evaluate("el => el.scrollIntoView({block: 'center'})")
            save_screenshot(page, tmp_path, f"memory_plot_{width}")
            boxes = plot.evaluate(PLOT_BOXES)
            assert len(boxes["peak"]) == 1 and len(boxes["legend"]) >= 3, boxes
            peak, svg = boxes["peak"][0], boxes["svg"]
            assert svg[0] <= peak[0] and peak[2] <= svg[2], (width, boxes)  # not cut
            for other in boxes["legend"] + boxes["other"]:
                assert not _overlap(peak, other), (width, peak, other)
    assert errors.errors == [], errors.errors


FIRST_VIEW = """
import sys, torch, torch.nn.functional as F
import jointlab as jl
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
inputs = {"x": torch.randn(5, 3), "y": torch.randn(5, 1)}
def train_fn(m, x, y):
    return F.mse_loss(m(x), y)
joint = jl.trace(model, train_fn, inputs)
before = set(sys.modules)
w = jl.Stepper(joint, model, inputs, device="cpu", seed=0).widget(train_fn=train_fn)
w.buttons["step"].click()
print(sorted(m for m in set(sys.modules) - before
             if m.split(".")[0] == "pandas" or m.startswith("jointlab.analysis.compare.compare")))
"""


def test_the_panels_first_view_waits_for_pandas_and_compare():
    """A fresh process: Stepper(...).widget() and one step load neither pandas nor the compare
    machinery (bench/bench_first_view.py: pandas was half of the panel's first view); its
    compare button still loads them (test_step_over_module_and_compare_table)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", FIRST_VIEW], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout[-2000:]
