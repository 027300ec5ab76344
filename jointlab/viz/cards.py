"""Small fixed-size HTML cards that notebooks show for jointlab results.

- :func:`summary_card_html`: a :class:`jointlab.JointGraph` (its ``_repr_html_``).
- :func:`memory_card_html`: a :class:`jointlab.MemoryProfile` (its ``_repr_html_``).

The numbers come from the analysis layer (:func:`jointlab.analysis.tables.card_facts`,
the profile's fields); this module only lays them out. Every string that comes
from the model or the graph is escaped. Plain HTML: no plotly is imported.
"""

from __future__ import annotations

import html
from typing import Any

from jointlab.analysis.tables import card_facts
from jointlab.units import human_bytes, human_count
from jointlab.viz.comparison import COMPARISON_STYLE, comparison_html

__all__ = ["memory_card_html", "summary_card_html"]

_CARD_STYLE = ("font-family:system-ui,sans-serif;font-size:12px;border:1px solid #ccc;"
               "border-radius:6px;padding:6px 10px;display:inline-block;line-height:1.5")


def _flops_text(n: int, unknown: int) -> str:
    text = human_count(n, "FLOP")
    if unknown:
        text += f" + unknown ({unknown:,} nodes without a count)"
    return html.escape(text)


def _assumed_text(a: dict[str, Any], shape_guards: int) -> str:
    """The card's "traced under" line: modes, trainable, dropout, autocast, guard count."""
    if not a["recorded"]:
        return "not recorded (archive saved before jointlab recorded it): nothing is checked"
    modes = ("train mode" if not a["eval"] else "eval mode" if not a["train"]
             else f"{a['train']} modules in train mode, {a['eval']} in eval mode")
    parts = [modes, f"{a['trainable']:,} trainable / {a['frozen']:,} frozen parameters"]
    if a["dropout"]:
        parts.append("dropout p=" + ", ".join(f"{p:g}" for p in a["dropout"]))
    parts.append("autocast " + (", ".join(f"{d} {t}" for d, t in a["autocast"].items())
                                if a["autocast"] else "off"))
    total = a["count"] + shape_guards
    parts.append(f"{total:,} guards checked on every run (joint.guards)")
    return html.escape(" · ".join(parts))


def summary_card_html(joint: Any) -> str:
    """A small, fixed-size HTML card for ``JointGraph._repr_html_``.

    Args:
        joint: A traced joint graph.

    Returns:
        HTML text whose size does not grow with the graph; every string that
        comes from the model or graph is escaped.
    """
    f = card_facts(joint)
    esc = html.escape
    phases = " · ".join(f"{esc(p)} {n:,}" for p, n in f["phases"].items() if n)
    rows = [
        ("nodes", f"{f['nodes']:,} ({phases})"),
        ("parameters", f"{f['param_numel']:,} in {f['params']:,} tensors"),
        ("FLOPs", f"forward {_flops_text(f['flops_fwd'], f['flops_unknown_fwd'])} · "
                  f"backward {_flops_text(f['flops_bwd'], f['flops_unknown_bwd'])}"),
        ("saved for backward", f"{esc(human_bytes(f['saved_bytes']))} "
                               f"in {f['saved_count']:,} values"),
        ("traced under", _assumed_text(f["assumed"], f["shape_guards"])),
    ]
    body = "".join(f"<tr><td style='color:#666;padding-right:10px'>{k}</td><td>{v}</td></tr>"
                   for k, v in rows)
    return (f"<div class='jointlab-card' style='{_CARD_STYLE}'>"
            f"<b>JointGraph</b> <span style='color:#666'>mode={esc(f['mode'])}</span>"
            f"<table style='border-collapse:collapse'>{body}</table></div>")


def _fmt(n: int | None) -> str:
    return "-" if n is None else human_bytes(n)


def memory_card_html(profile: Any) -> str:
    """The HTML card for ``MemoryProfile._repr_html_``.

    Args:
        profile: A :class:`jointlab.MemoryProfile`.

    Returns:
        HTML text: the predicted peaks, the measured peak and its error when
        measured, and the live bytes per category at the peak.
    """
    rows = [("peak (predicted)", _fmt(profile.peak_bytes)),
            ("at node", html.escape(profile.peak_node)),
            ("forward peak", _fmt(profile.forward_peak_bytes)),
            ("backward peak", _fmt(profile.backward_peak_bytes))]
    if profile.measured:
        rows += [("peak (measured)", _fmt(profile.measured_peak_bytes)),
                 ("error", f"{100 * (profile.peak_error or 0.0):+.2f}%"),
                 ("workspace (largest)", _fmt(profile.workspace_peak_bytes or 0))]
    cat = profile.by_category()
    rows += [(html.escape(str(c)), _fmt(int(v))) for c, v in cat.items() if v]
    body = "".join(f"<tr><th style='text-align:left'>{k}</th><td>{v}</td></tr>"
                   for k, v in rows)
    title = html.escape(f"MemoryProfile {profile.name}".strip())
    return (f"<div class='jointlab-memory'><b>{title}</b> "
            f"({len(profile.timeline)} steps, {len(profile.lifetimes)} storages, "
            f"{html.escape(profile.device)})<table>{body}</table></div>")


def card_html(kind: str, obj: Any) -> str:
    """Draw ``obj`` as the card ``kind`` names (see :func:`jointlab.display.rich_html`).

    Args:
        kind: ``"graph"``, ``"memory"``, ``"comparison"``, ``"modules"`` or ``"plan"``.
        obj: The object to read.

    Returns:
        An HTML fragment.

    Raises:
        ValueError: ``kind`` is none of these.
    """
    if kind == "graph":
        return summary_card_html(obj)
    if kind == "memory":
        return memory_card_html(obj)
    if kind == "comparison":
        return f"<style>{COMPARISON_STYLE}</style>{comparison_html(obj)}"
    if kind == "modules":
        from jointlab.viz.module_table import module_summary_html

        return module_summary_html(obj)
    if kind == "plan":
        from jointlab.viz.plan_check import plan_check_html

        return plan_check_html(obj)
    raise ValueError(f"no card for {kind!r}")
