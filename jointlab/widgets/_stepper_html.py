"""HTML of the stepper panel: the current-node card, value statistics, the comparison summary.

One table style for the whole panel (``.jl-sp``, defined once in :data:`CSS`):
no borders, a key column in grey, numbers in 4 significant digits. Every
string that comes from the model (names, modules, sources) is escaped.
"""

from __future__ import annotations

import html
import re
from typing import Any

import torch
import torch.fx as fx

from jointlab import meta as _meta
from jointlab.analysis.value_stats import describe
from jointlab.viz._style import PHASE_COLORS

__all__ = ["CSS", "breakpoint_label", "compare_card", "fmt", "node_card", "stats_card",
           "value_rows"]

CSS = """<style>
.jl-sp{font:13px system-ui,sans-serif;color:#1f2328;line-height:1.45}
.jl-sp table{border-collapse:collapse;margin:2px 0}
.jl-sp td{border:none;padding:1px 10px 1px 0;vertical-align:top;text-align:left}
.jl-sp td.k{color:#656d76;white-space:nowrap}
.jl-sp td.n{font-variant-numeric:tabular-nums;text-align:right}
.jl-sp code{background:#f6f8fa;padding:0 3px;border-radius:3px;font-size:12px}
.jl-sp .jl-head{font-size:14px;margin-bottom:2px}
.jl-sp .jl-op{font-weight:600}
.jl-sp .jl-tag{display:inline-block;padding:0 6px;border-radius:9px;font-size:11px;color:#fff}
.jl-sp .jl-src{color:#656d76;font-family:monospace;font-size:12px}
.jl-sp .jl-ok{color:#1a7f37;font-weight:600}
.jl-sp .jl-bad{color:#cf222e;font-weight:600}
.jl-sp .jl-div{border-left:3px solid #cf222e;padding:2px 8px;margin:4px 0;background:#fff5f5}
button.jl-chip{border-radius:12px;background:#ddf4ff;font-size:12px;height:24px;margin:2px}
</style>"""
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def fmt(x: Any) -> str:
    """A number in 4 significant digits (integers as they are)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    return str(x) if isinstance(x, int) else f"{x:.4g}"


def _esc(x: Any) -> str:
    return html.escape(str(x))


def _shape(node: Any) -> str:
    """``(2, 8, 32) float32`` of a node (or its plain value, for a constant argument)."""
    if not isinstance(node, fx.Node):
        return f"= {node!r}"[:40]
    m = _meta.info(node)
    if m.get("shape") is None:
        return "-"
    return f"({', '.join(map(str, m['shape']))}) {m.get('dtype', '')}"


def _name_code(node: fx.Node) -> str:
    """``<code>h.0.ln_1.weight</code>`` for a placeholder (graph name on hover), else its name."""
    name = _meta.value_name(node)
    hover = f" title='graph node {_esc(node.name)}'" if name != node.name else ""
    return f"<code{hover}>{_esc(name)}</code>"


def source_text(node: fx.Node, source: str) -> str:
    """The code line of the stack frame that ``source`` (``file.py:87``) names, or ``""``."""
    lines = (node.meta.get("stack_trace") or "").splitlines()
    for k, line in enumerate(lines[:-1]):
        frame = _FRAME.search(line)
        if frame and f"{frame.group(1).rsplit('/', 1)[-1]}:{frame.group(2)}" == source:
            return lines[k + 1].strip()
    return ""


def twin_text(node: fx.Node, backward_twins: dict[str, list[str]]) -> str:
    """``forward twin: gelu`` for a backward node, ``backward: gelu_backward`` for a forward one."""
    twin = _meta.info(node).get("fwd_twin")
    if twin:
        return f"forward twin <code>{_esc(twin)}</code>"
    back = backward_twins.get(node.name, [])
    if back:
        more = f" +{len(back) - 3}" if len(back) > 3 else ""
        return "backward " + ", ".join(f"<code>{_esc(b)}</code>" for b in back[:3]) + more
    return ""


def node_card(node: fx.Node | None, backward_twins: dict[str, list[str]]) -> str:
    """The current node, readably: op, phase, module, input and output shapes, source, twin."""
    if node is None:
        return "<div class='jl-sp jl-current'><b>done</b>: the output node has run</div>"
    m = _meta.info(node)
    phase = m.get("phase", "")
    tag = (f"<span class='jl-tag' style='background:{PHASE_COLORS.get(phase, '#656d76')}'>"
           f"{_esc(phase)}</span>" if phase else "")
    module = m.get("module", "")
    where = (f"in <code>{_esc(module)}</code> {_esc(m.get('module_type', ''))}" if module
             else f"in {_meta.ROOT_LABEL} {_esc(m.get('module_type', ''))}")
    head = (f"<div class='jl-head'>next: <span class='jl-op'>{_esc(_meta.op_name(node))}"
            f"</span> {_name_code(node)} {tag} {where}</div>")
    rows = []
    args = [a for a in node.args if isinstance(a, fx.Node)] or list(node.args)[:4]
    for k, a in enumerate(args[:6]):
        label = _name_code(a) if isinstance(a, fx.Node) else f"<code>arg {k}</code>"
        rows.append(("input" if k == 0 else "", f"{label} {_esc(_shape(a))}"))
    if len(args) > 6:
        rows.append(("", f"… {len(args) - 6} more inputs"))
    if node.op == "placeholder":
        what = _meta.value_name(node)
        rows.append(("value", f"<code>{_esc(what)}</code> {_esc(_shape(node))}"))
    elif node.op != "output":
        rows.append(("output", _esc(_shape(node))))
    src = m.get("source", "")
    text = source_text(node, src) if src else ""
    if src or text:
        rows.append(("source", f"{_esc(src)} <span class='jl-src'>{_esc(text)}</span>"))
    twin = twin_text(node, backward_twins)
    if twin:
        rows.append(("twin", twin))
    body = "".join(f"<tr><td class='k'>{k}</td><td>{v}</td></tr>" for k, v in rows)
    return f"<div class='jl-sp jl-current'>{head}<table>{body}</table></div>"


def stats_card(name: str, summary: dict[str, Any], histogram: str = "") -> str:
    """Shape, dtype and statistics of one value, numbers in 4 significant digits."""
    shape = summary.get("shape")
    head = (f"<div class='jl-head'>value of <code>{_esc(name)}</code>"
            + (f" ({', '.join(map(str, shape))}) {_esc(summary.get('dtype', ''))}"
               if shape is not None else "") + "</div>")
    keys = [k for k in ("min", "max", "mean", "std", "non_finite", "note", "device", "type",
                        "repr")
            if k in summary]
    body = "".join(f"<tr><td class='k'>{k.replace('_', '-')}</td>"
                   f"<td class='n'>{_esc(fmt(summary[k]))}</td></tr>" for k in keys)
    return f"<div class='jl-sp jl-value'>{head}<table>{body}</table>{histogram}</div>"


def value_rows(value: Any) -> dict[str, str]:
    """The DAG detail panel's rows for a held value: shape, mean, std, min, max, NaN/Inf, norm.

    The statistics are :func:`jointlab.analysis.value_stats.describe`'s, the same
    as ``jl.record``'s table: ``std`` is the population std (``correction=0``);
    a value with NaN or Inf is described over its finite elements and the
    ``NaN / Inf`` row counts the others; ``norm`` is the L2 norm. Numbers in 4
    significant digits. Of a tuple, the first tensor is described.

    Args:
        value: What the stepper holds for a node.

    Returns:
        ``{row: text}`` in display order.
    """
    items = value if isinstance(value, (tuple, list)) else [value]
    t = next((v for v in items if isinstance(v, torch.Tensor)), None)
    if t is None:
        return {"value": repr(value)[:80]}
    st = describe(t)
    rows = {"value": f"({', '.join(map(str, t.shape))}) {st.dtype}"}
    if st.note:
        return {**rows, "note": st.note}
    rows.update({"mean": fmt(st.mean), "std": fmt(st.std), "min": fmt(st.min),
                 "max": fmt(st.max), "NaN / Inf": f"{st.nan} / {st.inf}", "norm": fmt(st.norm)})
    return rows


def breakpoint_label(bp: Any) -> str:
    """``module h.1.attn``, ``op gelu_backward · non-finite``: the set parts of a breakpoint."""
    parts = [f"{k} {_meta.module_label(v)}" if k == "module" else f"{k} {v}"
             for k, v in (("node", bp.node), ("module", bp.module), ("op", bp.op))
             if v is not None]
    if bp.when is not None:
        parts.append(getattr(bp.when, "__name__", "predicate").replace("_", "-"))
    return " · ".join(parts) or "every node"


def compare_card(c: Any, worst: int = 5) -> str:
    """The comparison with eager: verdict, the first divergence on top, then the worst gradients."""
    good = c.verdict in ("bit-exact", "within tolerance")
    parts = [f"<div class='jl-head'>compared with eager autograd: "
             f"<span class='{'jl-ok' if good else 'jl-bad'}'>{_esc(c.verdict)}</span></div>"]
    d = c.first_divergence
    if d is not None:
        owner = _meta.module_label(d.module)
        parts.append(
            f"<div class='jl-div'><b>first divergence</b> <code>{_esc(d.node)}</code>: "
            f"{_esc(d.what)} of <code>{_esc(owner)}</code>, {_esc(d.phase)}, "
            f"{_esc(d.source or 'no source')}<br>max abs err {fmt(float(d.max_abs_err))}, "
            f"max rel err {fmt(float(d.max_rel_err))}</div>")
    grads = c.grads
    if len(grads):
        top = grads.sort_values("max_abs_err", ascending=False).head(worst)
        rows = "".join(
            f"<tr><td><code>{_esc(r['name'])}</code></td>"
            f"<td class='n'>{fmt(float(r['max_abs_err']))}</td>"
            f"<td class='n'>{fmt(float(r['cosine']))}</td>"
            f"<td>{'ok' if r['ok'] else '<span class=jl-bad>off</span>'}</td></tr>"
            for _, r in top.iterrows())
        parts.append(f"<table><tr><td class='k'>worst gradients</td><td class='k'>max abs err"
                     f"</td><td class='k'>cosine</td><td></td></tr>{rows}</table>")
    parts += [f"<div class='jl-src'>{_esc(n)}</div>" for n in c.notes if not c.exact]
    return f"<div class='jl-sp jl-compare'>{''.join(parts)}</div>"
