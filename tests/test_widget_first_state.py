"""Every jointlab widget opens with its first state: nothing is updated right after.

ipywidgets 7's classic front end (Colab's) builds a widget model asynchronously
after the kernel's ``comm_open`` and drops a state update that reaches the model
while it is still being built. A value set just after construction (a class
added, the ring moved, a chip added, the collapse depth) can then be lost on a
loaded machine: the panel showed no position and no card that way. The check
is at the widget protocol, in the kernel: while ``jl.explore`` and
``stepper.widget()`` build their widgets, no synced trait of a widget opened in
that same build may change (a change is an ``update`` message in a kernel), and
the opening state itself holds what the page needs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import ipywidgets as W
import pytest

import jointlab as jl
from jointlab.widgets._dagcursor import ALL, FIT
from tests.fixtures import zoo


@contextlib.contextmanager
def first_state_changes() -> Iterator[list[tuple[str, str]]]:
    """Record ``(widget class, trait)`` for each synced trait changed after its widget opened."""
    opened: set[int] = set()
    changed: list[tuple[str, str]] = []
    real_open, real_notify = W.Widget.open, W.Widget.notify_change

    def open_(self):
        real_open(self)
        opened.add(id(self))

    def notify(self, change):
        if id(self) in opened and change["name"] in self.keys:
            changed.append((type(self).__name__, change["name"]))
        real_notify(self, change)

    W.Widget.open, W.Widget.notify_change = open_, notify
    try:
        yield changed
    finally:
        W.Widget.open, W.Widget.notify_change = real_open, real_notify


@pytest.fixture(scope="module")
def traced():
    f = zoo.FIXTURES["mlp"]
    model, inputs = f.make_model(), f.make_inputs(4)
    return jl.trace(model, f.train_fn, inputs), model, inputs, f


def test_the_recorder_sees_an_update_after_opening():
    with first_state_changes() as changed:
        w = W.HTML("a")
        w.value = "b"
        w.add_class("x")
    assert changed == [("HTML", "value"), ("HTML", "_dom_classes")]


def test_explore_opens_every_widget_with_its_first_state(traced):
    joint, *_ = traced
    with first_state_changes() as changed:
        app = jl.explore(joint, height=300)
    assert changed == []
    view = app.explorer.view
    assert view.depth == app.explorer.depth.value == ALL  # a small graph: all nodes
    assert view.css_class == "jl-explore-dag"


def test_a_graph_over_the_node_budget_opens_as_the_budget_fits(traced, monkeypatch):
    from jointlab.widgets import _dagcursor

    joint, *_ = traced
    budget = len(joint.graph.nodes) - 1  # one node too many for the payload's budget
    monkeypatch.setattr(_dagcursor, "DEFAULT_BUDGET", budget)
    with first_state_changes() as changed:
        app = jl.explore(joint, height=300)
    assert changed == []
    assert app.explorer.view.depth == app.explorer.depth.value == FIT
    assert app.explorer.view.payload["budget"] == budget


@pytest.mark.parametrize("with_breakpoint", [False, True])
def test_stepper_panel_opens_every_widget_with_its_first_state(traced, with_breakpoint):
    joint, model, inputs, f = traced
    s = jl.Stepper(joint, model, inputs, device="cpu", seed=0)
    if with_breakpoint:
        s.add_breakpoint(op="addmm")
    with first_state_changes() as changed:
        panel = s.widget(train_fn=f.train_fn)
    assert changed == []
    assert "jl-stepper" in panel._dom_classes
    assert panel.position_label.value == f"position 0 / {len(s.nodes)}"
    assert panel.dag.current == s.current.name  # the ring is on the first node from the start
    chips = panel.chips.box
    assert "jl-chips" in chips._dom_classes
    assert [c.description.split()[0] for c in chips.children] == (["op"] if with_breakpoint
                                                                   else [])
