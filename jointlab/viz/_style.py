"""Presentation constants shared by every view: phase colours, the module palette.

One place for the colours a user sees, so a module keeps its colour in
``dag_view``, the stepper panel, the report, the diff view and the static
export. Renderers read these; nothing here renders.

Module colours are keyed by the module's qualified name and depend only on
the graph (the order in which modules first appear), never on what a view
currently shows, so searching or opening a group never recolours anything.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["PALETTE", "PHASE_COLORS", "module_colors"]

#: Colours of the graph's phases (placeholders by kind, then forward/backward/output).
PHASE_COLORS: dict[str, str] = {
    "param": "#2ca02c", "buffer": "#8c564b", "input": "#7f7f7f",
    "forward": "#1f77b4", "backward": "#d62728", "output": "#9467bd",
}

#: Distinct module colours (tab20 reordered, dark first).
PALETTE: tuple[str, ...] = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896",
    "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
)


def _parent(prefix: str) -> str | None:
    return prefix.rsplit(".", 1)[0] if "." in prefix else ("" if prefix else None)


def module_colors(prefixes: Iterable[str]) -> dict[str, str]:
    """A stable colour for every module prefix, keyed by name.

    Modules take colours in the order they first appear in ``prefixes`` (pass them
    in graph order), each the palette colour used longest ago (never used first) among
    those its parent and its siblings so far do not have: siblings differ while there
    are colours for them, a module differs from its parent, and a colour comes back as
    late as that allows, whatever the depth (``up`` and ``down.1`` of a U-Net differ;
    colours counted per depth gave them the same one). The result depends only on the
    graph.

    Args:
        prefixes: Module prefixes such as ``"transformer.h.0.attn"``, in graph
            order; repeats are ignored. The root is ``""``.

    Returns:
        ``{prefix: "#rrggbb"}`` for every distinct prefix given.
    """
    seen: dict[str, str] = {}
    last = dict.fromkeys(PALETTE, -1)
    kids: dict[str | None, set[str]] = {}
    for p in prefixes:
        if p in seen:
            continue
        parent = _parent(p)
        taken = kids.setdefault(parent, set())
        avoid = taken | {seen.get(parent or "", "")} if parent is not None else taken
        pool = [c for c in PALETTE if c not in avoid] or [
            c for c in PALETTE if c != seen.get(parent or "")] or list(PALETTE)
        color = min(pool, key=lambda c: (last[c], PALETTE.index(c)))
        seen[p] = color
        last[color] = len(seen)
        taken.add(color)
    return seen
