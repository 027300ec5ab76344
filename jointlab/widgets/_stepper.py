"""``stepper_widget``: an ipywidgets panel that drives a :class:`jointlab.Stepper`.

Controls: Step, Step over module, Continue, Reset; a breakpoint editor
(node / module / op / non-finite); the current node with its row of
``joint.nodes``; a value inspector (shape, dtype, stats, histogram) and,
on demand, the comparison table against eager autograd.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W
import torch

from jointlab import meta as _meta

__all__ = ["stepper_widget", "value_summary"]


def value_summary(value: Any) -> dict[str, Any]:
    """Shape, dtype and statistics of a node value (first tensor of a tuple)."""
    items = value if isinstance(value, (tuple, list)) else [value]
    tensors = [v for v in items if isinstance(v, torch.Tensor)]
    if not tensors:
        return {"type": type(value).__name__, "repr": repr(value)[:200]}
    t = tensors[0]
    out: dict[str, Any] = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                           "device": str(t.device)}
    if t.numel() and (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
        x = t.detach().double()
        finite = torch.isfinite(x)
        out.update(min=float(x.min()), max=float(x.max()), mean=float(x.mean()),
                   std=float(x.std()) if x.numel() > 1 else 0.0,
                   non_finite=int((~finite).sum()))
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


def _row_html(stepper: Any, node: Any) -> str:
    try:
        table = stepper.joint.nodes
        row = table.loc[[node.name]] if node.name in table.index else None
    except Exception:  # noqa: BLE001 - the table is optional for the panel
        row = None
    if row is None:
        info = _meta.info(node)
        return html.escape(f"{info.get('phase', '')} {info.get('module', '')}")
    cols = [c for c in ("op", "target", "phase", "module", "shape", "dtype", "flops")
            if c in row.columns]
    return row[cols].to_html(escape=True)


#: Above this many nodes the panel leaves the DAG out unless asked (``dag=True``).
DAG_MAX_NODES = 5000


class DagCursor:
    """The joint graph's DAG as a FigureWidget with a ring on the stepper's current node."""

    def __init__(self, joint: Any) -> None:
        """Build the figure once; :meth:`move` only updates the ring's coordinates."""
        import plotly.graph_objects as go

        from jointlab.viz.dag import plot_dag

        fig = plot_dag(joint, height=380, title="current node (ring)")
        self.where: dict[str, tuple[float, float]] = {}
        for tr in fig.data:
            if tr.customdata is not None:
                for name, x, y in zip(tr.customdata, tr.x, tr.y):
                    self.where[str(name)] = (float(x), float(y))
        fig.add_trace(go.Scattergl(x=[], y=[], mode="markers", name="current node",
                                   hoverinfo="skip", marker={"size": 20, "color": "rgba(0,0,0,0)",
                                                             "line": {"width": 3,
                                                                      "color": "#d62728"}}))
        self.figure = go.FigureWidget(fig)
        self.ring = self.figure.data[-1]

    def move(self, name: str | None) -> None:
        """Put the ring on node ``name`` (or hide it)."""
        x, y = self.where.get(name, (None, None)) if name else (None, None)
        with self.figure.batch_update():
            self.ring.x = [] if x is None else [x]
            self.ring.y = [] if y is None else [y]


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
    cursor = DagCursor(stepper.joint) if dag else None
    b_step = W.Button(description="Step")
    b_over = W.Button(description="Step over module", layout=W.Layout(width="auto"))
    b_cont = W.Button(description="Continue")
    b_reset = W.Button(description="Reset")
    position = W.Label()
    current = W.HTML()
    message = W.HTML()
    inspector = W.HTML()
    compare_box = W.HTML(comparison._repr_html_() if comparison is not None else "")
    bp_kind = W.Dropdown(options=["node", "module", "op", "non-finite"], value="module",
                         description="break on")
    bp_text = W.Text(placeholder="node name / module prefix / op")
    b_add = W.Button(description="Add breakpoint", layout=W.Layout(width="auto"))
    b_clear = W.Button(description="Clear breakpoints", layout=W.Layout(width="auto"))
    bp_list = W.HTML()
    inspect_name = W.Text(placeholder="node name to inspect")
    b_inspect = W.Button(description="Inspect")
    b_compare = W.Button(description="Compare with eager", layout=W.Layout(width="auto"))

    def show_value(name: str | None) -> None:
        if name is None:
            inspector.value = ""
            return
        try:
            v = stepper.value(name)
        except Exception as exc:  # noqa: BLE001 - shown to the user
            inspector.value = f"<i>{html.escape(str(exc))}</i>"
            return
        stats = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(x))}</td></tr>"
                        for k, x in value_summary(v).items())
        inspector.value = (f"<b>{html.escape(name)}</b><table>{stats}</table>"
                           + _histogram_html(v))

    def refresh(last: str | None = None) -> None:
        total = len(stepper.nodes)
        position.value = f"position {stepper.position} / {total}"
        node = stepper.current
        if node is None:
            current.value = "<b>done</b>"
        else:
            current.value = (f"<code>{html.escape(node.format_node())}</code>"
                             + _row_html(stepper, node))
        bp_list.value = "<br>".join(html.escape(repr(b)) for b in stepper.breakpoints)
        if cursor is not None:
            cursor.move(None if node is None else node.name)
        show_value(last)

    def guarded(action):
        def handler(_button: Any) -> None:
            message.value = ""
            last = None
            try:
                last = action()
            except Exception as exc:  # noqa: BLE001 - shown in the panel
                message.value = f"<span style='color:#cf222e'>{html.escape(str(exc))}</span>"
            if stepper.hit is not None:
                message.value += html.escape(f" stopped at {stepper.hit[1].name}")
            refresh(last)
        return handler

    def do_step():
        node = stepper.current
        stepper.step()
        return None if node is None or node.op == "output" else node.name

    def do_over():
        stepper.step_over_module()
        return None

    def do_continue():
        stepper.run()
        return stepper.hit[1].name if stepper.hit and stepper.hit[0].when else None

    def do_reset():
        stepper.reset()

    def do_add():
        kind, text = bp_kind.value, bp_text.value.strip()
        if kind == "non-finite":
            stepper.add_breakpoint(when="non-finite")
        else:
            stepper.add_breakpoint(**{kind: text})

    def do_inspect():
        return inspect_name.value.strip() or None

    def do_compare():
        compare_box.value = stepper.compare(train_fn=train_fn)._repr_html_()

    b_step.on_click(guarded(do_step))
    b_over.on_click(guarded(do_over))
    b_cont.on_click(guarded(do_continue))
    b_reset.on_click(guarded(do_reset))
    b_add.on_click(guarded(do_add))
    b_clear.on_click(guarded(stepper.clear_breakpoints))
    b_inspect.on_click(guarded(do_inspect))
    b_compare.on_click(guarded(do_compare))
    refresh()
    panel = W.VBox([
        W.HBox([b_step, b_over, b_cont, b_reset, position]),
        message, current,
        W.HBox([bp_kind, bp_text, b_add, b_clear]), bp_list,
        W.HBox([inspect_name, b_inspect]), inspector,
        b_compare, compare_box,
        *([cursor.figure] if cursor is not None else []),
    ])
    panel.add_class("jl-stepper")
    panel.position_label = position  # type: ignore[attr-defined]
    panel.buttons = {"step": b_step, "over": b_over, "continue": b_cont,  # type: ignore[attr-defined]
                     "reset": b_reset, "add": b_add, "clear": b_clear, "compare": b_compare}
    panel.inspector = inspector  # type: ignore[attr-defined]
    panel.compare_box = compare_box  # type: ignore[attr-defined]
    panel.dag = cursor  # type: ignore[attr-defined]
    return panel
