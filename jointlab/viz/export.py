"""``jl.export_figure``: a static, labelled SVG (or PNG) of a DAG or a memory plot.

The DAG comes from the one DAG engine: the layout ``dag_view`` runs in the
browser (:mod:`jointlab.viz._layout`, held equal to the renderer (``static/dag_*.js``) by
``tests/test_layout_parity.py``), over the same items (one box per module
group and band, or every node), in the view's colours
(:mod:`jointlab.viz._style`), arranged on a page (:mod:`jointlab.viz._page`):
long chains wrap into rows to meet a target aspect ratio or width, the
forward band over the backward band or beside it. The memory plots
(:func:`jointlab.plot_memory`, :func:`jointlab.plot_lifetimes`, or any plotly
figure of line/area scatters and bars) are drawn from the figure's own traces
(:mod:`jointlab.viz._svgplot`). A DAG needs neither plotly nor a browser.

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

from jointlab import meta as jl_meta
from jointlab.errors import ExportError
from jointlab.passes.analyze import require_analyzed
from jointlab.viz import _layout, _page, _svg, _svgplot
from jointlab.viz._dagdata import DagData
from jointlab.viz._svgcolor import item_colors
from jointlab.viz._viewitems import view_items

__all__ = ["dag_svg_text", "export_figure", "find_chromium"]

COLOR_BY = ("module", "phase")  # and the name of any of ``layers``
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          "--disable-dev-shm-usage", "--force-device-scale-factor=1"]


def in_view_order(data: DagData, rank: list[int]) -> DagData:
    """``data``'s items in the view's order, edges and twins renumbered.

    The order is :func:`jointlab.viz._layout.topo_order` of the item graph, ranked
    by each item's first graph node (as the renderer, ``static/dag_*.js``, orders the
    visible items).
    """
    order = _layout.topo_order(len(data.names), rank, data.src.tolist(), data.dst.tolist())
    new = np.empty(len(order), dtype=np.int64)
    new[order] = np.arange(len(order))
    twin = [int(new[data.twin[i]]) if data.twin[i] >= 0 else -1 for i in order]
    return DagData([data.names[i] for i in order], [data.info[i] for i in order],
                   new[data.src], new[data.dst], twin, [data.members[i] for i in order])


def _check_depth(depth: Any) -> None:
    if depth is None or depth == "auto":
        return
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ExportError(f"depth must be 'auto', None (every node) or an int >= 1, "
                          f"got {depth!r}")


def dag_svg_text(joint: Any, *, depth: int | str | None = "auto", max_groups: int = 60,
                 title: str | None = None, aspect: float | None = 1.414,
                 width: float | None = None, arrange: str = "stacked",
                 color_by: str = "module",
                 layers: dict[str, dict[str, Any]] | None = None) -> str:
    """The SVG text of ``joint``'s DAG, laid out to a page.

    Args:
        joint: A traced joint graph.
        depth: Module-tree levels opened, as in ``dag_view`` (levels count where the
            module tree branches); ``"auto"``: whole levels while at most ``max_groups``
            items (nodes and boxes) are drawn, as ``dag_view(budget=...)`` opens;
            ``None``: every node. Unless ``None``, open modules' plumbing (views,
            ``getitem``, ``detach``, ops building constants) is folded into the edges,
            and the subtitle says how many.
        max_groups: Item budget of ``depth="auto"``.
        title: Heading; a summary line by default.
        aspect: Target width/height of the page (1.414: landscape A4); the rows
            are chosen to come closest and the page is padded to it exactly.
        width: Target page width in pixels: the fewest rows that fit it (the page is
            then not padded to ``aspect``).
        arrange: ``"stacked"`` (each row's forward band over its backward band) or
            ``"side"`` (side by side).
        color_by: ``"module"`` (the view's module colours), ``"phase"``, or the name
            of one of ``layers``.
        layers: Label colourings ``{name: {node_name: label}}`` as ``dag_view`` takes
            them (e.g. ``compiled.kernel_layer()``): ranked, the first twelve with a
            colour and a short legend name of their own, a box coloured only when
            all its nodes share a label.

    Returns:
        The SVG document.

    Raises:
        ExportError: A bad ``depth``, ``arrange``, ``color_by``, ``aspect`` or ``width``.
    """
    _check_page_args(aspect, width, arrange, color_by, layers)
    _check_depth(depth)
    if width is not None:  # padding to an aspect would make the page wider than asked
        aspect = None
    require_analyzed(joint.graph_module)
    # module boxes hold everything; an open module's plumbing (views, getitem, detach, ops
    # building constants such as masks) is folded into its edges unless every node is asked
    data, rank = view_items(joint, depth, max_groups, fold_plumbing=depth is not None)
    folded = len(joint.graph.nodes) - sum(len(m) for m in data.members)
    data = in_view_order(data, rank)
    n = len(data.names)
    box = np.asarray(["count" in m for m in data.info], dtype=bool)
    w = np.where(box, float(_layout.BOX_COLS), 1.0)
    h = np.where(box, _layout.BOX_SLOT, _layout.NODE_SLOT)
    lay = _layout.layered_layout(data.is_bwd, data.src, data.dst, data.twin, w=w, h=h)
    lines = _svg.item_lines(data)
    px = np.asarray([_svg.box_width([ln]) for ln in lines]) if n else np.zeros(0)
    col_px = max(float(np.max(px / w, initial=0.0)), 60.0) + _svg.COL_GAP
    row_px = _svg.ROW_PX
    modules = [str(jl_meta.info(nd).get("module", "")) for nd in joint.graph.nodes]
    colors, legend = item_colors(data, color_by, modules, (layers or {}).get(color_by))
    page = _page.arrange_page(lay, h, col_px, row_px, aspect=aspect, width=width,
                              arrange=arrange, top=_svg.TITLE_PX,
                              bottom_for=lambda pw: _svg.legend_height(len(legend), pw))
    sizes = (w * col_px - _svg.COL_GAP, np.where(box, _svg.BOX_H, _svg.NODE_H))
    nbox = int(box.sum())
    if title is None:
        title = f"Joint graph: {len(modules)} nodes" + (
            f", drawn as {n - nbox} nodes and {nbox} module boxes" if nbox else "")
    rows = len(page.strips)
    c = jl_meta.phase_counts(joint.graph.nodes)  # the card's counts: nodes, not drawn items
    sub = (f"forward ({c['forward']} ops) left→right, backward ({c['backward']} ops) right←left "
           f"{'below' if arrange == 'stacked' else 'beside'} it"
           + (f"; wrapped into {rows} rows" if rows > 1 else "")
           + (f"; {folded} plumbing ops (views, getitem, detach, constants) folded into "
              "the edges" if folded else ""))
    return _svg.dag_svg(data, page, sizes, colors, legend, title, sub, aspect=aspect,
                        max_width=width)


def _check_page_args(aspect: Any, width: Any, arrange: Any, color_by: Any,
                     layers: dict[str, dict[str, Any]] | None) -> None:
    if arrange not in _page.ARRANGEMENTS:
        raise ExportError(f"arrange must be one of {_page.ARRANGEMENTS}, got {arrange!r}")
    allowed = COLOR_BY + tuple(layers or ())
    if color_by not in allowed:
        raise ExportError(f"color_by must be one of {allowed}, got {color_by!r}")
    for name, values in (layers or {}).items():
        if any(isinstance(v, (int, float)) and not isinstance(v, bool)
               for v in values.values()):
            raise ExportError(f"layer {name!r} has numbers: the static export draws label "
                              "layers only; show numeric layers with jl.dag_view")
    for name, v in (("aspect", aspect), ("width", width)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not v > 0):
            raise ExportError(f"{name} must be a number > 0 or None, got {v!r}")


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
    if root.get("data-width"):
        return int(float(root.get("data-width"))), int(float(root.get("data-height")))
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


def _svg_of(obj: Any, page: dict[str, Any], title: str | None) -> str:
    if hasattr(obj, "graph_module"):
        return dag_svg_text(obj, title=title, **page)
    if hasattr(obj, "payload") and hasattr(obj, "write_html"):
        raise ExportError("export_figure takes the joint graph, not its dag_view: "
                          "jl.export_figure(joint, path, depth=...) draws the same engine's "
                          "layout and colours")
    if hasattr(obj, "timeline") and hasattr(obj, "peak_bytes"):  # a MemoryProfile
        try:
            from jointlab.viz.memory import plot_memory
        except ModuleNotFoundError as exc:
            raise ExportError("exporting a MemoryProfile draws plot_memory, which needs "
                              "plotly: pip install plotly (a joint graph's DAG needs "
                              "nothing)") from exc
        obj = plot_memory(obj)
    if hasattr(obj, "data") and hasattr(obj, "layout"):
        return _svgplot.figure_svg(obj, title=title)
    raise ExportError(f"cannot export a {type(obj).__name__}: pass a joint graph, a "
                      "MemoryProfile, or a plot_memory/plot_lifetimes figure")


def export_figure(obj: Any, path: str | os.PathLike[str], *, depth: int | str | None = "auto",
                  max_groups: int = 60, title: str | None = None,
                  aspect: float | None = 1.414, width: float | None = None,
                  arrange: str = "stacked", color_by: str = "module",
                  layers: dict[str, dict[str, Any]] | None = None,
                  timeout_s: float = 60.0) -> pathlib.Path:
    """Write a static, labelled figure of ``obj`` to ``path`` (``.svg`` or ``.png``).

    Args:
        obj: A joint graph (its DAG), a ``MemoryProfile`` (``plot_memory`` of it), or a
            ``plot_memory``/``plot_lifetimes`` figure.
        path: Output file; the suffix chooses the format.
        depth: For a joint graph: module-tree levels opened, ``"auto"`` (whole levels
            while at most ``max_groups`` items are drawn) or ``None`` (every node).
        max_groups: For ``depth="auto"``: the most items (nodes and boxes) drawn.
        title: Heading; the figure's own or a summary line by default.
        aspect: For a joint graph: the page's width/height (long chains wrap into rows
            to come close; the page is padded to it exactly). None: no target.
        width: For a joint graph: the page width in pixels to fit (fewest rows; the
            page is then not padded to ``aspect``).
        arrange: For a joint graph: ``"stacked"`` (forward over backward) or ``"side"``.
        color_by: For a joint graph: ``"module"`` (the view's colours), ``"phase"``, or
            a name in ``layers``.
        layers: For a joint graph: label colourings ``{name: {node_name: label}}``, as
            ``dag_view`` takes them (its legend is bounded the same way).
        timeout_s: How long Chromium may take for a PNG.

    Returns:
        The path written.

    Raises:
        ExportError: Unknown suffix or object, a bad page argument, or no Chromium for
            a PNG.
    """
    out = pathlib.Path(path)
    suffix = out.suffix.lower()
    if suffix not in (".svg", ".png"):
        raise ExportError(f"export_figure writes .svg or .png, got {out.name!r}")
    page = {"depth": depth, "max_groups": max_groups, "aspect": aspect, "width": width,
            "arrange": arrange, "color_by": color_by, "layers": layers}
    return write_svg_or_png(_svg_of(obj, page, title), out, timeout_s)


def write_svg_or_png(svg: str, out: pathlib.Path, timeout_s: float) -> pathlib.Path:
    """Write ``svg`` to ``out`` as SVG text, or rasterised by Chromium for a ``.png``.

    Args:
        svg: The figure's SVG document.
        out: A ``.svg`` or ``.png`` path (the caller checked the suffix).
        timeout_s: How long Chromium may take for a PNG.

    Returns:
        ``out``.
    """
    if out.suffix.lower() == ".svg":
        out.write_text(svg, encoding="utf-8")
    else:
        _png(svg, out, timeout_s)
    return out
