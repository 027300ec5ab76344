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


def _opened_during(build):
    """Run ``build``; the widgets it opened and the synced traits changed after opening."""
    opened = []
    real_open = W.Widget.open

    def open_(self):
        real_open(self)
        opened.append(self)

    W.Widget.open = open_
    try:
        with first_state_changes() as changed:
            root = build()
    finally:
        W.Widget.open = real_open
    return root, opened, changed


def _reachable(root) -> set[int]:
    """Ids of the widgets the front end reaches from ``root`` (children, layouts, styles)."""
    seen, todo = set(), [root]
    while todo:
        w = todo.pop()
        if id(w) in seen:
            continue
        seen.add(id(w))
        for key in w.keys:
            v = getattr(w, key, None)
            todo += [x for x in (v if isinstance(v, (list, tuple)) else [v])
                     if isinstance(x, W.Widget)]
    return seen


BUILDS = {
    "explore depth 2": lambda t: jl.explore(t[0], depth=2, height=300),
    "explore fit": lambda t: jl.explore(t[0], depth=FIT, height=300),
    "panel, no DAG": lambda t: jl.Stepper(t[0], t[1], t[2], device="cpu").widget(dag=False),
    "panel with a comparison": lambda t: jl.Stepper(t[0], t[1], t[2], device="cpu").widget(
        train_fn=t[3].train_fn, comparison=jl.compare(t[0], t[1], t[2], seed=0)),
    "panel, two breakpoints": lambda t: _with_breakpoints(
        jl.Stepper(t[0], t[1], t[2], device="cpu")).widget(),
}


def _with_breakpoints(s):
    s.add_breakpoint(module="fc2")
    s.add_breakpoint(when="non-finite")
    return s


@pytest.mark.parametrize("name", list(BUILDS))
def test_every_widget_we_build_opens_with_its_whole_state(traced, name):
    """Each build opens its widgets once with their state and never updates them after; every
    widget it opens is part of what is displayed (none left to a later message)."""
    root, opened, changed = _opened_during(lambda: BUILDS[name](traced))
    assert changed == [], name
    assert opened and {id(w) for w in opened} <= _reachable(root), name
    if name.startswith("panel"):
        assert root.position_label.value.startswith("position 0 /")
        assert root.current.value  # the card is in the opening message, not sent after
    if name == "panel with a comparison":
        assert "compared with eager" in root.compare_box.value
    if name == "panel, two breakpoints":
        assert len(root.chips.box.children) == 2
    if name.startswith("explore"):
        app = root.explorer
        assert all(b.icon == "check" and b.button_style == "info"
                   for b in app.phases.values())  # the toggles' look, not set after


def test_a_cursor_on_a_name_outside_the_graph_opens_unringed(traced):
    """A ring on a name the graph does not have is refused before the widget opens."""
    from jointlab.widgets._dagcursor import DagCursor

    joint, *_ = traced
    with first_state_changes() as changed:
        cursor = DagCursor(joint, at="not_a_node")
    assert changed == [] and cursor.current == ""
    first = next(iter(joint.graph.nodes)).name
    assert DagCursor(joint, at=first).current == first
