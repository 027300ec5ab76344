"""Static export: jl.export_figure of the 12-layer GPT-2 DAG collapsed to blocks, and memory.

Targets: the collapsed DAG exports to SVG in <= 5 s (the PNG adds one headless
Chromium screenshot). Plotly's own kaleido exporter is not a dependency; it was
measured at 9-11 s per image here (see jointlab/viz/export.py).
"""

from __future__ import annotations

import pathlib
import tempfile
import time


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def rows(ctx):
    from run import row

    import jointlab as jl
    from jointlab.viz.export import find_chromium

    joint = ctx.gpt2_joint
    model, _, inputs = ctx.gpt2
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        svg = pathlib.Path(tmp) / "dag.svg"
        t = min(_timed(lambda: jl.export_figure(joint, svg)) for _ in range(1 if ctx.quick else 3))
        out.append(row("gpt2-12L: export_figure(joint) SVG, collapsed to blocks", t, "s", "<= 5",
                       t <= 5, detail=f"{len(joint.graph.nodes)} nodes, {svg.stat().st_size} B"))
        if find_chromium():
            png = pathlib.Path(tmp) / "dag.png"
            t = _timed(lambda: jl.export_figure(joint, png))
            out.append(row("gpt2-12L: export_figure(joint) PNG (headless Chromium)", t, "s",
                           "<= 5", t <= 5, detail=f"{png.stat().st_size} B"))
        prof = joint.memory()
        t = _timed(lambda: jl.export_figure(prof, pathlib.Path(tmp) / "mem.svg"))
        out.append(row("gpt2-12L: export_figure(memory profile) SVG", t, "s", "<= 5", t <= 5))
    return out
