"""Stepper panel: buttons drive the stepper, labels and inspector follow it."""

from __future__ import annotations

import ipywidgets as W  # noqa: E402, F401
import pytest
import torch

import jointlab as jl
from tests.fixtures import zoo


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
    assert "addmm" in page and "[4, 32]" in page and "float32" in page
    assert f"{float(want.max())}"[:6] in page
    assert "jl-hist" in page


def test_breakpoint_editor_continue_and_reset(panel):
    s, w, *_ = panel
    editor = w.children[3].children
    editor[0].value, editor[1].value = "module", "fc3"
    w.buttons["add"].click()
    w.buttons["continue"].click()
    assert s.current.meta["jointlab"]["module"] == "fc3"
    assert "fc3" in w.children[4].value  # breakpoint list
    w.buttons["continue"].click()  # next fc3 node (forward addmm, then backward ones)
    assert s.current.meta["jointlab"]["module"] == "fc3"
    w.buttons["clear"].click()
    w.buttons["continue"].click()
    assert s.done and "done" in w.children[2].value
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
    assert "jointlab compare: bit-exact" in w.compare_box.value


def test_dag_ring_follows_the_current_node(panel):
    s, w, *_ = panel
    cursor = w.dag
    assert cursor is not None and cursor.figure in w.children

    def node_xy(name):
        for tr in cursor.figure.data[:-1]:
            if tr.customdata is not None and name in list(tr.customdata):
                k = list(tr.customdata).index(name)
                return tr.x[k], tr.y[k]
        raise AssertionError(name)

    for _ in range(3):
        assert (cursor.ring.x[0], cursor.ring.y[0]) == node_xy(s.current.name)
        w.buttons["step"].click()
    s.run()
    w.buttons["step"].click()  # at the end: nothing to ring
    assert len(cursor.ring.x) == 0


def test_dag_is_left_out_when_asked():
    f = zoo.FIXTURES["mlp"]
    model, inputs = f.make_model(), f.make_inputs(4)
    s = jl.Stepper(jl.trace(model, f.train_fn, inputs), model, inputs, device="cpu")
    assert s.widget(dag=False).dag is None
