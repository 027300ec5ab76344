"""The shared DAG layout's speed in Python: share of trace time, scaling to 50k, graphviz.

``plot_dag`` is now an alias of ``dag_view`` (whose rows, first paint, frames and
layout in the browser, are in ``bench_dagview.py``). The Python layout
(``viz/_layout.py``, mirrored by the renderer's ``layeredLayout``) serves the
static export. Rows (one run, ratios):

- the layout of every node of the 12-layer GPT-2 as a share of ``jl.trace`` time;
- layout time per node at ~5k and ~50k nodes (real joint traces of ``make_gpt2`` with
  more layers and d=32), and their ratio;
- torch's ``FxGraphDrawer`` (graphviz ``dot``) on the same 12-layer graph vs that layout.

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

SMALL_LAYERS, BIG_LAYERS = 38, 385  # ~5k and ~50k joint-graph nodes at d=32
DOT_TIMEOUT_S = 300


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


def _layout_s(joint, repeat: int) -> float:
    from jointlab.viz import _layout
    from jointlab.viz._dagdata import graph_data

    d = graph_data(joint)
    return timeit(lambda: _layout.layered_layout(d.is_bwd, d.src, d.dst, d.twin), repeat=repeat)


def rows(ctx):
    from jointlab.passes.analyze import ensure_analyzed

    out = []
    joint = ctx.gpt2_joint
    ensure_analyzed(joint.graph_module)
    n = len(joint.graph.nodes)
    build = _layout_s(joint, 3)
    share = build / ctx.gpt2_trace_s
    out.append(row("gpt2-12L: layered layout (every node) / jl.trace", share, "x", "<= 0.25",
                   share <= 0.25, detail=f"{n} nodes, layout {build * 1e3:.0f} ms, "
                   f"trace {ctx.gpt2_trace_s:.2f} s"))
    per = {}
    for label, layers in (("5k", SMALL_LAYERS), ("50k", BIG_LAYERS)):
        j = deep_joint(layers)
        ensure_analyzed(j.graph_module)
        nn = len(j.graph.nodes)
        t = _layout_s(j, 1 if ctx.quick else 3)
        per[label] = t / nn
        out.append(row(f"layout per node at {label} ({nn} nodes, {layers} layers)",
                       per[label] * 1e6, "us", detail=f"layout {t:.2f} s"))
    ratio = per["50k"] / per["5k"]
    out.append(row("layout per-node time 50k / 5k", ratio, "x", "<= 1.5", ratio <= 1.5))

    if shutil.which("dot") and _has_pydot():
        gv, done = graphviz_drawer_s(joint.graph_module)
        bound = "" if done else ">= (dot killed) "
        out.append(row("gpt2-12L: FxGraphDrawer+dot svg", gv, "s",
                       detail=f"{bound}finished={done}"))
        out.append(row("gpt2-12L: FxGraphDrawer / layered layout", gv / build, "x",
                       detail=f"{bound}{gv:.1f} s vs {build:.3f} s"))
    else:
        out.append(row("gpt2-12L: FxGraphDrawer (skipped: no pydot/dot)", float("nan"), "s"))
    return out


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
    from jointlab.viz._dagdata import graph_data

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
