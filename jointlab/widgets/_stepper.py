"""``stepper_widget``: an ipywidgets panel that drives a :class:`jointlab.Stepper`.

Controls: Step, Step over module, Continue, Reset; a breakpoint editor
(node / module / op / non-finite) with the breakpoints as removable chips;
the current node, readably (op, module, shapes, source, twin); a value
inspector (statistics, histogram); on demand, the comparison with eager
(cleared by Reset); and the DAG with the current node ringed
(:class:`jointlab.widgets._dagcursor.DagCursor`). The HTML is in
:mod:`jointlab.widgets._stepper_html`.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as W
import torch

from jointlab import meta as _meta
from jointlab.analysis.value_stats import describe
from jointlab.errors import ValueNotAvailableError
from jointlab.widgets._dagcursor import DagCursor
from jointlab.widgets._stepper_html import (
    CSS,
    breakpoint_label,
    compare_card,
    node_card,
    stats_card,
    value_rows,
)

__all__ = ["stepper_widget", "value_summary"]


def value_summary(value: Any) -> dict[str, Any]:
    """Shape, dtype and statistics of a node value (first tensor of a tuple).

    The statistics are :func:`jointlab.analysis.value_stats.describe`'s, the same
    as ``jl.record``'s table (population std; over the finite elements, with the
    NaN/Inf count in ``non_finite``).
    """
    items = value if isinstance(value, (tuple, list)) else [value]
    tensors = [v for v in items if isinstance(v, torch.Tensor)]
    if not tensors:
        return {"type": type(value).__name__, "repr": repr(value)[:200]}
    t = tensors[0]
    st = describe(t)
    out: dict[str, Any] = {"shape": list(st.shape or ()), "dtype": st.dtype,
                           "device": str(t.device)}
    if st.note:
        out["note"] = st.note
    else:
        out.update(min=st.min, max=st.max, mean=st.mean, std=st.std,
                   non_finite=int(st.nan or 0) + int(st.inf or 0))
    return out


def _histogram_html(value: Any, bins: int = 24) -> str:
    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or not value.numel():
        return ""
    x = value.detach().double().flatten().cpu()
    x = x[torch.isfinite(x)]
    if not x.numel():
        return ""
    counts = torch.histc(x, bins=bins, min=float(x.min()), max=float(x.max()))
    top = float(counts.max()) or 1.0
    bars = "".join(
        f"<div title='{int(c)}' style='display:inline-block;width:6px;margin-right:1px;"
        f"height:{max(1, int(40 * float(c) / top))}px;background:#4c78a8'></div>"
        for c in counts)
    style = "display:flex;align-items:flex-end;height:42px"
    return f"<div class='jl-hist' style='{style}'>{bars}</div>"


#: Above this many nodes the panel leaves the DAG out unless asked (``dag=True``).
DAG_MAX_NODES = 5000
#: Most kept values whose statistics the DAG's detail panel carries (the latest run).
DAG_MAX_VALUES = 64


def held_values(stepper: Any, last: str | None) -> dict[str, dict[str, str]]:
    """Detail-panel rows of the values the stepper holds that a user asks about.

    Those are the node just run (``last``), the current node's inputs and the kept
    values (``keep=``), the latest :data:`DAG_MAX_VALUES` of them.

    Args:
        stepper: The :class:`jointlab.Stepper`.
        last: Name of the node just run, if any.

    Returns:
        ``{node_name: rows}`` (see :func:`jointlab.widgets._stepper_html.value_rows`).
    """
    runner, node = stepper.runner, stepper.current
    names = [n.name for n in stepper.env
             if runner.keep_all or n.name in runner.keep][-DAG_MAX_VALUES:]
    if node is not None:
        names += [a.name for a in node.all_input_nodes]
    if last is not None:
        names.append(last)
    out = {}
    for name in dict.fromkeys(names):
        try:
            out[name] = value_rows(stepper.value(name))
        except ValueNotAvailableError:  # freed after its last use: no rows
            continue
    return out


def backward_twins(nodes: list[Any]) -> dict[str, list[str]]:
    """Per forward node name, the backward nodes whose ``fwd_twin`` it is."""
    out: dict[str, list[str]] = {}
    for node in nodes:
        twin = _meta.info(node).get("fwd_twin")
        if twin:
            out.setdefault(twin, []).append(node.name)
    return out


class BreakpointChips:
    """The stepper's breakpoints as chips; clicking a chip removes that breakpoint."""

    def __init__(self, stepper: Any, on_change: Callable[[], None]) -> None:
        """Show ``stepper.breakpoints``; call ``on_change()`` after a removal."""
        self.stepper, self.on_change = stepper, on_change
        self.shown: list[Any] = list(stepper.breakpoints)
        # the first chips and the classes go in at construction, in the box's opening
        # message (ipywidgets 7's front end can drop an update sent right after it)
        self.box = W.HBox(self._chips(), layout=W.Layout(flex_flow="row wrap"),
                          _dom_classes=("jl-chips",))

    def _chips(self) -> list[W.Button]:
        chips = []
        for bp in self.shown:
            chip = W.Button(description=f"{breakpoint_label(bp)}  \u2715",
                            tooltip="remove this breakpoint", layout=W.Layout(width="auto"),
                            _dom_classes=("jl-chip",))
            chip.on_click(lambda _b, bp=bp: self.remove(bp))
            chips.append(chip)
        return chips

    def refresh(self) -> None:
        """Rebuild the chips when the breakpoints changed."""
        if self.shown == self.stepper.breakpoints and len(self.box.children) == len(self.shown):
            return
        self.shown = list(self.stepper.breakpoints)
        self.box.children = self._chips()

    def remove(self, bp: Any) -> None:
        """Remove one breakpoint (if still set) and refresh the panel."""
        if any(b is bp for b in self.stepper.breakpoints):
            self.stepper.remove_breakpoint(bp)
        self.on_change()


def _field() -> W.Layout:
    """A text box's layout: it fills its row's room, never under 180 px."""
    return W.Layout(flex="1 1 240px", min_width="180px", width="auto")


def _row(children: list[W.Widget]) -> W.HBox:
    """A row of controls that wraps when the notebook is narrow (no control is cut)."""
    return W.HBox(children, layout=W.Layout(flex_flow="row wrap", align_items="center"))


class StepperPanel:
    """The widgets of the panel and the handlers that drive the stepper from them."""

    def __init__(self, stepper: Any, train_fn: Any, comparison: Any, dag: bool) -> None:
        """Create the widgets; :meth:`refresh` fills them from the stepper."""
        self.stepper, self.train_fn = stepper, train_fn
        self.twins = backward_twins(stepper.nodes)
        first = stepper.current
        self.cursor = DagCursor(stepper.joint, at=None if first is None else first.name,
                                values=held_values(stepper, None)) if dag else None
        self.value_names = {n.name: _meta.value_name(n) for n in stepper.nodes
                            if n.op == "placeholder"}  # arg0_1 -> h.0.ln_1.weight
        html_box = {"layout": W.Layout(width="100%")}
        self.style, self.message = W.HTML(CSS), W.HTML(**html_box)
        # the first position and card go in at construction, inside each widget's opening
        # message: ipywidgets 7's front end drops updates that reach a model it is still
        # creating, so values set just after (refresh) could be lost on a loaded machine
        self.current = W.HTML(node_card(stepper.current, self.twins), **html_box)
        self.inspector = W.HTML(**html_box)
        self.compare_box = W.HTML(compare_card(comparison) if comparison is not None else "",
                                  **html_box)
        self.position = W.Label(self.position_text(), layout=W.Layout(flex="0 0 auto"))
        self.bp_kind = W.Dropdown(options=["node", "module", "op", "non-finite"],
                                  value="module", description="break on",
                                  layout=W.Layout(width="220px", flex="0 0 auto"))
        self.bp_text = W.Text(placeholder="node name / module prefix / op", layout=_field())
        self.inspect_name = W.Text(placeholder="node name to inspect", layout=_field())
        self.chips = BreakpointChips(stepper, lambda: self.refresh())
        self.buttons = {key: self._button(text, action) for key, text, action in (
            ("step", "Step", self.do_step), ("over", "Step over module", self.do_over),
            ("continue", "Continue", self.do_continue), ("reset", "Reset", self.do_reset),
            ("add", "Add breakpoint", self.do_add),
            ("clear", "Clear breakpoints", stepper.clear_breakpoints),
            ("inspect", "Inspect", self.do_inspect),
            ("compare", "Compare with eager", self.do_compare))}

    def _button(self, text: str, action: Callable[[], Any]) -> W.Button:
        # as wide as its text and never shrunk by its row (a row too narrow wraps instead)
        button = W.Button(description=text, layout=W.Layout(width="auto", flex="0 0 auto",
                                                            min_width="72px"))
        button.on_click(self.guarded(action))
        return button

    def widget(self) -> W.VBox:
        """The panel: controls, the current node, breakpoints, inspector, comparison, DAG."""
        b = self.buttons
        return W.VBox(_dom_classes=("jl-stepper",), children=[
            _row([b["step"], b["over"], b["continue"], b["reset"], self.position]),
            self.message, self.current,
            _row([self.bp_kind, self.bp_text, b["add"], b["clear"]]), self.chips.box,
            _row([self.inspect_name, b["inspect"]]), self.inspector,
            b["compare"], self.compare_box, self.style,
            *([self.cursor] if self.cursor is not None else []),
        ])

    def show_value(self, name: str | None) -> None:
        """Statistics and histogram of node ``name``'s value (or clear the inspector)."""
        if name is None:
            self.inspector.value = ""
            return
        try:
            v = self.stepper.value(name)
        except Exception as exc:  # noqa: BLE001 - shown to the user
            self.inspector.value = f"<div class='jl-sp'><i>{html.escape(str(exc))}</i></div>"
            return
        shown = self.value_names.get(name, name)
        self.inspector.value = stats_card(shown, value_summary(v), _histogram_html(v))

    def position_text(self) -> str:
        """The position label's text: ``position N / M``."""
        return f"position {self.stepper.position} / {len(self.stepper.nodes)}"

    def refresh(self, last: str | None = None) -> None:
        """Position, current node, chips, ring and inspector from the stepper's state."""
        s = self.stepper
        self.position.value = self.position_text()
        node = s.current
        self.current.value = node_card(node, self.twins)
        self.chips.refresh()
        if self.cursor is not None:
            self.cursor.move(None if node is None else node.name)
            self.cursor.values = held_values(s, last)
        self.show_value(last)

    def guarded(self, action: Callable[[], Any]) -> Callable[[Any], None]:
        """A click handler: run ``action``, refresh, then show its error or the breakpoint hit.

        The message is set last, so a front end that shows it has already been
        sent the refreshed card, chips and ring (widget messages arrive in order).
        """
        def handler(_button: Any) -> None:
            self.message.value, last, msg = "", None, ""
            try:
                last = action()
            except Exception as exc:  # noqa: BLE001 - shown in the panel
                msg = f"<div class='jl-sp jl-bad'>{html.escape(str(exc))}</div>"
            hit = self.stepper.hit
            if hit is not None:
                when = "after" if hit[0].when is not None else "before"
                msg += (f"<div class='jl-sp'>stopped {when} <code>"
                        f"{html.escape(_meta.value_name(hit[1]))}</code> by breakpoint "
                        f"<b>{html.escape(breakpoint_label(hit[0]))}</b></div>")
            self.refresh(last)
            self.message.value = msg
        return handler

    def do_step(self) -> str | None:
        """Run one node; inspect its value."""
        node = self.stepper.current
        self.stepper.step()
        return None if node is None or node.op == "output" else node.name

    def do_over(self) -> None:
        """Run to the first node outside the current node's module."""
        self.stepper.step_over_module()

    def do_continue(self) -> str | None:
        """Run to the next breakpoint; inspect the value that tripped a value condition."""
        self.stepper.run()
        hit = self.stepper.hit
        return hit[1].name if hit and hit[0].when else None

    def do_reset(self) -> None:
        """Back to the first node; the comparison shown is cleared (it was of another run)."""
        self.stepper.reset()
        self.compare_box.value = ""

    def do_add(self) -> None:
        """Add the breakpoint typed in the editor (refused when it matches nothing)."""
        kind, text = self.bp_kind.value, self.bp_text.value.strip()
        if kind == "non-finite":
            self.stepper.add_breakpoint(when="non-finite")
        else:
            self.stepper.add_breakpoint(**{kind: text})

    def do_inspect(self) -> str | None:
        """Inspect the node named in the inspector's box."""
        return self.inspect_name.value.strip() or None

    def do_compare(self) -> None:
        """Compare the graph with eager from the stepper's start; show the summary."""
        self.compare_box.value = compare_card(self.stepper.compare(train_fn=self.train_fn))


def stepper_widget(stepper: Any, train_fn: Any = None, comparison: Any = None,
                   dag: bool | None = None) -> W.VBox:
    """Build the panel for ``stepper``.

    Args:
        stepper: A :class:`jointlab.Stepper`.
        train_fn: The training step, for the "Compare with eager" button
            (default: ``joint.train_fn``).
        comparison: A :class:`jointlab.Comparison` to show from the start.
        dag: Show the DAG with the current node ringed; by default only for
            graphs of at most :data:`DAG_MAX_NODES` nodes.

    Returns:
        An ``ipywidgets.VBox``; its ``position`` label reads ``position N / M``.
    """
    if dag is None:
        dag = len(stepper.nodes) <= DAG_MAX_NODES
    p = StepperPanel(stepper, train_fn, comparison, dag)
    p.refresh()
    panel = p.widget()
    panel.position_label = p.position  # type: ignore[attr-defined]
    panel.buttons = p.buttons  # type: ignore[attr-defined]
    panel.current = p.current  # type: ignore[attr-defined]
    panel.chips = p.chips  # type: ignore[attr-defined]
    panel.message = p.message  # type: ignore[attr-defined]
    panel.inspector = p.inspector  # type: ignore[attr-defined]
    panel.compare_box = p.compare_box  # type: ignore[attr-defined]
    panel.dag = p.cursor  # type: ignore[attr-defined]
    return panel
