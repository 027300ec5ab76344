"""``jl.export_figure``: a static, labelled SVG (or PNG) of a DAG or a memory plot.

The SVG is written directly, without a browser: the DAG from the same
layered layout the interactive plot uses, collapsed to module groups (one
labelled box per module and side: forward above, backward below), and the
memory plots (:func:`jointlab.plot_memory`, :func:`jointlab.plot_lifetimes`,
or any plotly figure of line/area scatters and bars) from the figure's own
traces (:mod:`jointlab.viz._svgplot`).

A ``.png`` path renders that SVG with the system Chromium, headless (no
window, no network: ``--screenshot`` of the local file). Without Chromium it
refuses with :class:`jointlab.errors.ExportError`; the SVG needs nothing.

Plotly's own exporter (kaleido 1.5 driving the same Chromium) was measured
and rejected: 9-11 s per image on this machine even for a 300-point line
chart, against milliseconds for the direct SVG (``bench/bench_static.py``).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile
from typing import Any

import numpy as np

from jointlab.errors import ExportError
from jointlab.passes.analyze import require_analyzed
from jointlab.viz import _layout, _svg, _svgplot
from jointlab.viz._dagdata import DagData, collapse, graph_data

__all__ = ["dag_svg_text", "export_figure", "find_chromium"]

MAX_DEPTH = 8
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          "--disable-dev-shm-usage", "--force-device-scale-factor=1"]


def in_flow_order(data: DagData, full: DagData) -> DagData:
    """``data``'s groups reordered by their first compute node, edges renumbered.

    ``collapse`` numbers groups by their first member, and a module's
    parameter placeholders come first, so a block would sort before the ops
    that feed it; the layout reads index order as data-flow order.
    """
    pos = {n: i for i, n in enumerate(full.names)}
    state = {n for n, m in zip(full.names, full.info)
             if m.get("phase") in ("param", "buffer", "input")}
    key = [min((pos[n] for n in ms if n not in state), default=min(pos[n] for n in ms))
           for ms in data.members]
    order = sorted(range(len(key)), key=key.__getitem__)
    new = {old: k for k, old in enumerate(order)}
    remap = np.asarray([new[i] for i in range(len(order))], dtype=np.int64)
    twin = [new[data.twin[i]] if data.twin[i] >= 0 else -1 for i in order]
    return DagData([data.names[i] for i in order], [data.info[i] for i in order],
                   remap[data.src], remap[data.dst], twin, [data.members[i] for i in order])


def _auto_depth(data: DagData, max_groups: int) -> tuple[DagData, int]:
    """The deepest module collapse with at most ``max_groups`` groups (at least depth 1)."""
    best, best_depth = collapse(data, 1), 1
    for depth in range(2, MAX_DEPTH + 1):
        nxt = collapse(data, depth)
        if len(nxt.names) > max_groups or len(nxt.names) == len(best.names):
            break
        best, best_depth = nxt, depth
    return best, best_depth


def dag_svg_text(joint: Any, *, depth: int | str = "auto", max_groups: int = 60,
                 title: str | None = None) -> str:
    """The SVG text of ``joint``'s DAG collapsed to module groups.

    Args:
        joint: A traced joint graph.
        depth: Module FQN components kept per group, or ``"auto"``: the
            deepest level with at most ``max_groups`` groups.
        max_groups: Group budget of ``depth="auto"``.
        title: Heading; a summary line by default.

    Returns:
        The SVG document.

    Raises:
        ExportError: ``depth`` is neither ``"auto"`` nor an int >= 1.
    """
    require_analyzed(joint.graph_module)
    full = graph_data(joint)
    if depth == "auto":
        data, depth = _auto_depth(full, max_groups)
    elif isinstance(depth, int) and not isinstance(depth, bool) and depth >= 1:
        data = collapse(full, depth)
    else:
        raise ExportError(f"depth must be 'auto' or an int >= 1, got {depth!r}")
    data = in_flow_order(data, full)
    lay = _layout.layered_layout(data.is_bwd, data.src, data.dst, data.twin)
    if title is None:
        title = (f"Joint graph: {len(full.names)} nodes in {len(data.names)} module groups "
                 f"(depth {depth}); forward above, backward below")
    return _svg.dag_svg(data, lay, title)


def find_chromium() -> str | None:
    """The system Chromium (``$JOINTLAB_CHROMIUM``, then ``chromium`` on PATH), or None."""
    for cand in (os.environ.get("JOINTLAB_CHROMIUM"), shutil.which("chromium"),
                 shutil.which("chromium-browser"), "/usr/bin/chromium"):
        if cand and pathlib.Path(cand).exists():
            return cand
    return None


def _svg_size(svg: str) -> tuple[int, int]:
    import xml.etree.ElementTree as ET

    root = ET.fromstring(svg)
    return int(float(root.get("width", 800))), int(float(root.get("height", 600)))


def _png(svg: str, path: pathlib.Path, timeout_s: float) -> None:
    """Render ``svg`` to ``path`` with headless Chromium."""
    exe = find_chromium()
    if exe is None:
        raise ExportError("a PNG needs the system Chromium (apt-get install chromium, or set "
                          "JOINTLAB_CHROMIUM); export to a .svg path instead, which needs nothing")
    w, h = _svg_size(svg)
    with tempfile.TemporaryDirectory(prefix="jointlab-export-") as tmp:
        src = pathlib.Path(tmp) / "figure.svg"
        src.write_text(svg, encoding="utf-8")
        out = pathlib.Path(tmp) / "figure.png"
        cmd = [exe, *_FLAGS, f"--user-data-dir={tmp}/profile", f"--window-size={w},{h}",
               f"--screenshot={out}", src.as_uri()]
        try:
            run = subprocess.run(cmd, capture_output=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise ExportError(f"Chromium did not render the PNG within {timeout_s:.0f} s; "
                              "export a .svg instead") from exc
        if not out.exists():
            tail = run.stderr.decode(errors="replace")[-500:]
            raise ExportError(f"Chromium wrote no PNG (exit {run.returncode}): {tail}")
        shutil.copyfile(out, path)


def _svg_of(obj: Any, depth: int | str, max_groups: int, title: str | None) -> str:
    if hasattr(obj, "graph_module"):
        return dag_svg_text(obj, depth=depth, max_groups=max_groups, title=title)
    data, lay = getattr(obj, "_jointlab_data", None), getattr(obj, "_jointlab_layout", None)
    if data is not None and lay is not None:  # a plot_dag figure: its own groups and layout
        head = title or str(obj.layout.title.text or "Joint graph")
        return _svg.dag_svg(data, lay, head)
    if hasattr(obj, "timeline") and hasattr(obj, "peak_bytes"):  # a MemoryProfile
        from jointlab.viz.memory import plot_memory

        obj = plot_memory(obj)
    if hasattr(obj, "data") and hasattr(obj, "layout"):
        return _svgplot.figure_svg(obj, title=title)
    raise ExportError(f"cannot export a {type(obj).__name__}: pass a joint graph, a plot_dag "
                      "figure, a MemoryProfile, or a plot_memory/plot_lifetimes figure")


def export_figure(obj: Any, path: str | os.PathLike[str], *, depth: int | str = "auto",
                  max_groups: int = 60, title: str | None = None,
                  timeout_s: float = 60.0) -> pathlib.Path:
    """Write a static, labelled figure of ``obj`` to ``path`` (``.svg`` or ``.png``).

    Args:
        obj: A joint graph (its DAG, collapsed to modules), a ``plot_dag``
            figure (as drawn, e.g. ``depth=2``), a ``MemoryProfile``
            (``plot_memory`` of it), or a ``plot_memory``/``plot_lifetimes`` figure.
        path: Output file; the suffix chooses the format.
        depth: For a joint graph: module components per group, or ``"auto"``.
        max_groups: For ``depth="auto"``: the most groups drawn.
        title: Heading; the figure's own or a summary line by default.
        timeout_s: How long Chromium may take for a PNG.

    Returns:
        The path written.

    Raises:
        ExportError: Unknown suffix or object, or no Chromium for a PNG.
    """
    out = pathlib.Path(path)
    suffix = out.suffix.lower()
    if suffix not in (".svg", ".png"):
        raise ExportError(f"export_figure writes .svg or .png, got {out.name!r}")
    svg = _svg_of(obj, depth, max_groups, title)
    if suffix == ".svg":
        out.write_text(svg, encoding="utf-8")
    else:
        _png(svg, out, timeout_s)
    return out
