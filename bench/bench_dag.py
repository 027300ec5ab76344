"""DAG figure speed: build time vs trace time, scaling to 50k nodes, browser render, graphviz.

Rows (one run, ratios):

- full uncollapsed ``plot_dag`` of the 12-layer GPT-2 as a share of ``jl.trace`` time;
- build time per node at ~5k and ~50k nodes (real joint traces of ``make_gpt2`` with
  more layers and d=32), and their ratio;
- headless Chromium: time to first render of the 50k-node plotly page and whether a hover
  label appears (skipped when chromium or playwright is missing); ``bench_dagview.py`` has
  the rows of ``dag_view``, the bundled canvas renderer;
- torch's ``FxGraphDrawer`` (graphviz ``dot``) on the same 12-layer graph vs ``plot_dag``.

``python bench/bench_dag.py --engines`` instead times layout engines (graphviz dot,
igraph Sugiyama, grandalf, ours) at ~2k and ~50k nodes for the README.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from bench_dagview import deep_joint  # cached on disk: traced once
from run import row, timeit

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SMALL_LAYERS, BIG_LAYERS = 38, 385  # ~5k and ~50k joint-graph nodes at d=32
DOT_TIMEOUT_S = 300


def browser_first_render(html_path: str) -> tuple[float, bool]:
    """Seconds from navigation until plotly has drawn, and whether hovering shows a label."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            tempfile.mkdtemp(), executable_path=CHROMIUM, args=FLAGS, headless=True,
            viewport={"width": 1400, "height": 700})
        page = ctx.new_page()
        t0 = time.perf_counter()
        page.goto("file://" + html_path, timeout=300_000)
        page.wait_for_function(
            "() => { const d = document.querySelector('div.js-plotly-plot');"
            " return d && d._fullLayout && d.querySelector('.gl-canvas-context') }",
            timeout=300_000)
        page.evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")
        first = time.perf_counter() - t0
        xy = page.evaluate(
            """() => { const d = document.querySelector('div.js-plotly-plot');
                 const fl = d._fullLayout, box = d.getBoundingClientRect();
                 const t = d._fullData.find(t => t.customdata && t.x.length > 0);
                 return [box.left + fl._size.l + fl.xaxis.l2p(t.x[0]),
                         box.top + fl._size.t + fl.yaxis.l2p(t.y[0])]; }""")
        page.mouse.move(xy[0] - 1, xy[1])
        page.mouse.move(xy[0], xy[1])
        try:  # a real mouse hover over the first node must show its label
            page.wait_for_selector(".hoverlayer .hovertext", timeout=30_000)
            hovered = "phase:" in (page.text_content(".hoverlayer .hovertext") or "")
        except Exception:  # playwright's TimeoutError: no label appeared
            hovered = False
        ctx.close()
    return first, bool(hovered)


def graphviz_drawer_s(gm) -> tuple[float, bool]:
    """Seconds for FxGraphDrawer + graphviz to render SVG, and whether it finished.

    graphviz is stopped after ``DOT_TIMEOUT_S``; the time is then a lower bound.
    """
    from torch.fx.passes.graph_drawer import FxGraphDrawer

    t0 = time.perf_counter()
    dot = FxGraphDrawer(gm, "joint").get_dot_graph()
    src = dot.to_string()
    with tempfile.NamedTemporaryFile("w", suffix=".dot", delete=False) as f:
        f.write(src)
    try:
        subprocess.run(["dot", "-Tsvg", f.name, "-o", f.name + ".svg"], check=True,
                       timeout=DOT_TIMEOUT_S, capture_output=True)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t0, False
    return time.perf_counter() - t0, True


def rows(ctx):
    from jointlab.passes.analyze import ensure_analyzed
    from jointlab.viz.dag import plot_dag

    out = []
    joint = ctx.gpt2_joint
    ensure_analyzed(joint.graph_module)
    n = len(joint.graph.nodes)
    build = timeit(lambda: plot_dag(joint), repeat=3)
    share = build / ctx.gpt2_trace_s
    out.append(row("gpt2-12L: plot_dag (full) / jl.trace", share, "x", "<= 0.25", share <= 0.25,
                   detail=f"{n} nodes, build {build * 1e3:.0f} ms, trace {ctx.gpt2_trace_s:.2f} s"))

    per = {}
    figs = {}
    for label, layers in (("5k", SMALL_LAYERS), ("50k", BIG_LAYERS)):
        j = deep_joint(layers)
        ensure_analyzed(j.graph_module)
        nn = len(j.graph.nodes)
        t = timeit(lambda j=j: plot_dag(j), repeat=1 if ctx.quick else 3)
        per[label] = t / nn
        figs[label] = (j, nn)
        out.append(row(f"plot_dag per node at {label} ({nn} nodes, {layers} layers)",
                       per[label] * 1e6, "us", detail=f"build {t:.2f} s"))
    ratio = per["50k"] / per["5k"]
    out.append(row("plot_dag per-node time 50k / 5k", ratio, "x", "<= 1.5", ratio <= 1.5))

    big, nbig = figs["50k"]
    if os.path.exists(CHROMIUM) and _has_playwright():
        with tempfile.TemporaryDirectory() as d:
            path = str(pathlib.Path(d) / "dag50k.html")
            plot_dag(big).write_html(path, include_plotlyjs=True)
            mb = os.path.getsize(path) / 2**20
            first, hovered = browser_first_render(path)
        out.append(row(f"chromium: first render of {nbig}-node DAG", first, "s",
                       "renders+hover", hovered, detail=f"page {mb:.1f} MB, hover={hovered}"))
    else:
        out.append(row("chromium: first render of 50k-node DAG (skipped: no chromium)",
                       float("nan"), "s", "renders+hover", None))

    if shutil.which("dot") and _has_pydot():
        gv, done = graphviz_drawer_s(joint.graph_module)
        bound = "" if done else ">= (dot killed) "
        out.append(row("gpt2-12L: FxGraphDrawer+dot svg", gv, "s",
                       detail=f"{bound}finished={done}"))
        out.append(row("gpt2-12L: FxGraphDrawer / plot_dag", gv / build, "x",
                       detail=f"{bound}{gv:.1f} s vs {build:.3f} s"))
    else:
        out.append(row("gpt2-12L: FxGraphDrawer (skipped: no pydot/dot)", float("nan"), "s"))
    return out


def _has_playwright() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return True


def _has_pydot() -> bool:
    try:
        import pydot  # noqa: F401
    except ImportError:
        return False
    return True


# -- layout-engine comparison (the README) -------------------------------------------
ENGINE_CODE = {
    "graphviz dot": None,
    "igraph sugiyama": (
        "import igraph as ig, numpy as np, sys; e = np.load(sys.argv[1]);"
        "g = ig.Graph(n=int(e.max()) + 1, edges=e.tolist(), directed=True);"
        "g.layout_sugiyama()"),
    "grandalf sugiyama": (
        "import numpy as np, sys; from grandalf.graphs import Vertex, Edge, Graph;"
        "from grandalf.layouts import SugiyamaLayout; e = np.load(sys.argv[1]);"
        "V = [Vertex(i) for i in range(int(e.max()) + 1)];"
        "[setattr(v, 'view', type('V', (), {'w': 10, 'h': 10})()) for v in V];"
        "g = Graph(V, [Edge(V[a], V[b]) for a, b in e.tolist()]);"
        "[ (lambda s: (s.init_all(), s.draw(2)))(SugiyamaLayout(c)) for c in g.C]"),
}


def _time_engine(name: str, edges_path: str, dot_path: str, timeout: float) -> str:
    t0 = time.perf_counter()
    try:
        if name == "graphviz dot":
            subprocess.run(["dot", "-Tplain", dot_path, "-o", dot_path + ".out"], check=True,
                           timeout=timeout, capture_output=True)
        else:
            subprocess.run([sys.executable, "-c", ENGINE_CODE[name], edges_path], check=True,
                           timeout=timeout, capture_output=True)
    except subprocess.TimeoutExpired:
        return f"> {timeout:.0f} s (killed)"
    except subprocess.CalledProcessError as e:
        return f"failed: {e.stderr.decode()[-120:]!r}"
    return f"{time.perf_counter() - t0:.2f} s"


def compare_engines(timeout: float = 120) -> None:
    """Print a markdown table of layout times at ~2k and ~50k nodes."""
    import numpy as np

    from jointlab.viz import _layout
    from jointlab.viz.dag import graph_data

    print("| graph | nodes | edges | engine | layout time |\n|---|---|---|---|---|")
    for label, layers in (("gpt2 12L d=256", None), ("gpt2 385L d=32", BIG_LAYERS)):
        if layers is None:
            from run import Context

            j = Context().gpt2_joint
        else:
            j = deep_joint(layers)
        d = graph_data(j)
        n, e = len(d.names), len(d.src)
        tmp = tempfile.mkdtemp()
        ep = os.path.join(tmp, "e.npy")
        np.save(ep, np.stack([d.src, d.dst], 1))
        dp = os.path.join(tmp, "g.dot")
        with open(dp, "w") as f:
            f.write("digraph g {\n" + "".join(f"{a}->{b};\n" for a, b in zip(d.src, d.dst)) + "}\n")
        t = timeit(lambda d=d: _layout.layered_layout(d.is_bwd, d.src, d.dst, d.twin), repeat=3)
        print(f"| {label} | {n} | {e} | jointlab (ours) | {t:.3f} s |", flush=True)
        for name in ENGINE_CODE:
            print(f"| {label} | {n} | {e} | {name} | {_time_engine(name, ep, dp, timeout)} |",
                  flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    if "--engines" in sys.argv:
        compare_engines()
