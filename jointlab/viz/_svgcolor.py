"""Colours of the static DAG's items and its legend, from the one palette.

Module colours are :func:`jointlab.viz._style.module_colors` over every module
prefix of the graph in node order, keyed by name, so a module has the colour
the view gives it. Label layers (``color_by="kernel"``) are ranked and coloured
as ``dag_view`` colours them (:mod:`jointlab.viz._legend`): the first
:data:`~jointlab.viz._legend.LEGEND_LEVELS` with their own colour and a short
legend name (the full one in its tooltip), the rest in paler hues behind one
``+N more`` entry; a box shows a label only when all its labelled nodes share it.
"""

from __future__ import annotations

from typing import Any

from jointlab.meta import ROOT_LABEL, module_label
from jointlab.viz import _legend, _svg
from jointlab.viz._dagdata import DagData
from jointlab.viz._style import PALETTE, PHASE_COLORS, module_colors

MIXED, NONE = "#999999", "#dddddd"

Legend = list[tuple[str, str, str]]


def item_colors(data: DagData, color_by: str, modules: list[str],
                layer: dict[str, Any] | None = None) -> tuple[list[str], Legend]:
    """Colour per item and the (bounded) legend.

    Args:
        data: The drawn items (``members``: the node names of each).
        color_by: ``"module"``, ``"phase"`` or a layer's name.
        modules: Every graph node's module, in graph order.
        layer: The layer's ``{node_name: label}`` when ``color_by`` names one.

    Returns:
        ``(colours, legend)``; legend entries are ``(short name, full name, colour)``.
    """
    if layer is not None:
        return _layer_colors(data, layer)
    if color_by == "phase":
        keys = [str(m.get("phase", "")) for m in data.info]
        colors = {k: PHASE_COLORS.get(k, "#777777") for k in keys}
        return [colors[k] for k in keys], _svg.legend_entries(keys, colors)
    prefixes = [""]
    for mod in dict.fromkeys(modules):
        parts = mod.split(".") if mod else []
        prefixes += [".".join(parts[:k]) for k in range(1, len(parts) + 1)]
    palette = module_colors(prefixes)
    keys = ["" if m.get("module") in (None, ROOT_LABEL) else str(m["module"]) for m in data.info]
    colors = {module_label(k): palette.get(k, "#777777") for k in keys}
    names = [module_label(k) for k in keys]
    return [colors[k] for k in names], _svg.legend_entries(names, colors)


def _item_level(members: list[str], code: dict[str, int]) -> int:
    """An item's level: the one all its labelled nodes share, -2 if mixed, -1 if none."""
    got = {code[n] for n in members if n in code}
    return got.pop() if len(got) == 1 else (-2 if got else -1)


def _layer_colors(data: DagData, layer: dict[str, Any]) -> tuple[list[str], Legend]:
    names = [n for ms in data.members for n in ms] if data.members else list(data.names)
    labels = [None if layer.get(n) in (None, "") else str(layer[n]) for n in names]
    levels = _legend.rank_levels(labels)
    index = {lv: k for k, lv in enumerate(levels)}
    code = {n: index[lb] for n, lb in zip(names, labels) if lb is not None}
    hues = [c if c.startswith("#") else _hex(c) for c in _legend.level_colors(levels, PALETTE)]
    members = data.members or [[n] for n in data.names]
    item = [_item_level(ms, code) for ms in members]
    colors = [hues[k] if k >= 0 else (MIXED if k == -2 else NONE) for k in item]
    cap = _legend.LEGEND_LEVELS
    legend = [(_legend.short_label(lv), lv, hues[k]) for k, lv in enumerate(levels[:cap])]
    if len(levels) > cap:
        legend.append((f"+{len(levels) - cap} more", ", ".join(levels[cap:]), ""))
    legend += [("(mixed)", "items whose nodes carry different labels", MIXED),
               ("(none)", "no label", NONE)]
    return colors, legend


def _hex(hsl: str) -> str:
    """``hsl(h,s%,l%)`` (the paler level hues) as ``#rrggbb`` (the box fill tints it)."""
    import colorsys

    h, s, lum = (float(x.strip("%")) for x in hsl[4:-1].split(","))
    r, g, b = colorsys.hls_to_rgb(h / 360, lum / 100, s / 100)
    return "#" + "".join(f"{round(c * 255):02x}" for c in (r, g, b))
