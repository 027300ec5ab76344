"""Static export: jl.export_figure of DAGs (a ~1k-node graph, the 12-layer GPT-2) and memory.

Targets: a ~1k-node joint graph exports to SVG in <= 1 s with every node
labelled (``depth=None``) and collapsed (``depth="auto"``), laid out to an A4
page (the row wrapping included); the 12-layer GPT-2 collapsed and its memory
plot in <= 5 s; the PNG adds one headless Chromium screenshot. Also reported:
the page's aspect against its target (width/height over 1.414). Plotly's own
kaleido exporter is not a dependency; it was measured at 9-11 s per image here
(see jointlab/viz/export.py).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

from run import ROOT


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _aspect(svg: pathlib.Path) -> float:
    _, _, w, h = map(float, ET.parse(svg).getroot().get("viewBox").split())
    return w / h


def thousand_rows(ctx, tmp: pathlib.Path) -> list:
    """A ~1k-node GPT-2 (8 layers, d=32): SVG every node and collapsed, and the aspect."""
    from run import row

    import jointlab as jl
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2

    joint = jl.trace(make_gpt2(n_layer=8, d=32, seq=8), lm_train_fn, lm_inputs(2, 1024, 8))
    n = len(joint.graph.nodes)
    out = []
    for depth, what in ((None, "every node labelled"), ("auto", "collapsed to <= 60 items")):
        svg = tmp / f"k1-{depth}.svg"
        t = min(_timed(lambda d=depth, p=svg: jl.export_figure(joint, p, depth=d))
                for _ in range(1 if ctx.quick else 3))
        out.append(row(f"{n}-node graph: export_figure SVG, {what}", t, "s", "<= 1", t <= 1,
                       detail=f"{svg.stat().st_size} B"))
        ratio = _aspect(svg) / 1.414
        out.append(row(f"{n}-node graph ({what}): page aspect / target 1.414", ratio, "x",
                       "0.99-1.01", 0.99 <= ratio <= 1.01))
    return out


def rows(ctx):
    from run import row

    import jointlab as jl
    from jointlab.viz.export import find_chromium

    joint = ctx.gpt2_joint
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        out += thousand_rows(ctx, pathlib.Path(tmp))
        svg = pathlib.Path(tmp) / "dag.svg"
        t = min(_timed(lambda: jl.export_figure(joint, svg)) for _ in range(1 if ctx.quick else 3))
        out.append(row("gpt2-12L: export_figure(joint) SVG, collapsed", t, "s", "<= 5",
                       t <= 5, detail=f"{len(joint.graph.nodes)} nodes, {svg.stat().st_size} B"))
        if find_chromium():
            png = pathlib.Path(tmp) / "dag.png"
            t = _timed(lambda: jl.export_figure(joint, png))
            out.append(row("gpt2-12L: export_figure(joint) PNG (headless Chromium)", t, "s",
                           "<= 5", t <= 5, detail=f"{png.stat().st_size} B"))
        first = min(_fresh_first_svg() for _ in range(1 if ctx.quick else 3))
        out.append(row("gpt2-12L: first export_figure(joint) SVG in a fresh process", first, "s",
                       "<= 0.5", first <= 0.5, detail="wall, after the trace; best of 3 "
                       "processes (the figure's imports included)"))
        prof = joint.memory()
        t = _timed(lambda: jl.export_figure(prof, pathlib.Path(tmp) / "mem.svg"))
        out.append(row("gpt2-12L: export_figure(memory profile) SVG", t, "s", "<= 5", t <= 5))
    return out


def _fresh_first_svg() -> float:
    """Wall seconds of the first ``export_figure`` SVG in a fresh Python, after tracing."""
    out = subprocess.run([sys.executable, __file__], cwd=ROOT.parent, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["first_svg_s"]


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT.parent))
    import jointlab as jl
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2

    _joint = jl.trace(make_gpt2(n_layer=12, d=256), lm_train_fn, lm_inputs(2, 1024, 64))
    with tempfile.TemporaryDirectory() as _tmp:
        _t0 = time.perf_counter()
        jl.export_figure(_joint, pathlib.Path(_tmp) / "dag.svg")
        print(json.dumps({"first_svg_s": time.perf_counter() - _t0}))
