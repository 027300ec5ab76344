"""``dag_view`` (the bundled canvas DAG) at ~50k nodes in headless Chromium, and the first figure.

Rows (one run; browser times come from the page's own clock, ``performance.now()``):

- page size of ``dag_view`` of a 385-layer GPT-2 (~50k joint-graph nodes);
- first paint: navigation start to the end of the view's first frame (collapsed view);
- opening one transformer block (~130 nodes) by a real mouse click: mousedown to the end
  of the frame that shows it;
- zoom and pan frames by real wheel and drag at the fully zoomed-out collapsed view, at
  label zoom, and fully zoomed out with every group open: the slowest input-to-frame-end
  latency (the event's ``timeStamp`` to the end of the frame after it);
- search (typed, Enter) to the frame with the matches highlighted and the first one centred
  with its whole label, for one node name and for an op with one match per layer;
- the 12-layer GPT-2: layered layout and the whole ``dag_view`` build as shares of trace;
- the first ``plot_dag`` and ``dag_view`` in a fresh process (median of 3): time from a
  traced graph to the notebook mime bundle, and whether ``jsonschema``/``rfc3987_syntax``
  were imported.

The 50k graph is traced once and cached with ``joint.save`` in ``$TMPDIR``, keyed by a hash
of the jointlab sources that shape a trace (everything but ``viz/`` and ``widgets/``);
``JOINTLAB_BENCH_BIG_GRAPH=path`` loads that saved graph instead (a cache made by another
checkout of the same model).
Screenshots go to ``$JOINTLAB_DAG_SHOTS`` (default ``/tmp/dagscale_shots``).
``python bench/bench_dagview.py [layers]`` prints the rows without ``bench/run.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from run import row, timeit

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
BIG_LAYERS = 385  # ~50k joint-graph nodes at d=32
SHOTS = pathlib.Path(os.environ.get("JOINTLAB_DAG_SHOTS", "/tmp/dagscale_shots"))
VIEW = "document.querySelector('.jl-dag').jlView"


def _trace_hash() -> str:
    """Hash of the jointlab sources that decide what a trace holds."""
    h = hashlib.sha256()
    for p in sorted((ROOT / "jointlab").rglob("*.py")):
        rel = p.relative_to(ROOT / "jointlab").as_posix()
        if not rel.startswith(("viz/", "widgets/")):
            h.update(rel.encode() + p.read_bytes())
    return h.hexdigest()[:12]


def deep_joint(n_layer: int) -> Any:
    """A real joint trace of a deep, narrow GPT-2 (d=32, 2 heads, seq 8), cached on disk."""
    import jointlab as jl
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2

    name = f"jointlab-bench-gpt2-{n_layer}L-{_trace_hash()}.jl"
    path = pathlib.Path(os.environ.get("JOINTLAB_BENCH_BIG_GRAPH") or
                        pathlib.Path(tempfile.gettempdir()) / name)
    if path.exists():
        return jl.load(str(path))
    m = make_gpt2(n_layer=n_layer, d=32, n_head=2, vocab=128, seq=16)
    joint = jl.trace(m, lm_train_fn, lm_inputs(1, 128, 8))
    joint.save(str(path))
    return joint


# -- the page -------------------------------------------------------------------------
WATCH = f"""() => {{ const v = {VIEW};
    window.__jlIn = [];  // input timestamps (same clock as performance.now())
    const note = e => window.__jlIn.push(e.timeStamp);
    for (const t of ['mousedown', 'wheel', 'mousemove']) v.canvas.addEventListener(t, note, true);
    v.search.addEventListener('keydown', e => {{ if (e.key === 'Enter') note(e); }}, true); }}"""
SETTLE = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r())))"
LATENCY = f"""() => {{ const v = {VIEW}, t = window.__jlIn; window.__jlIn = [];
    return t.length ? v.lastFrameEnd - t[0] : null; }}"""


def _latency(page: Any, act: Any) -> float:
    """ms from the first input event of ``act()`` to the end of the frame drawn after it."""
    page.evaluate("() => { window.__jlIn = []; }")
    act()
    page.evaluate(SETTLE)
    return float(page.evaluate(LATENCY))


def _frames(page: Any) -> float:
    """Slowest of a few real wheel zooms (in and out) and drag pans, in ms."""
    box = page.locator(".jl-canvas").bounding_box()
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    worst = 0.0
    for dy in (-120, 120, -120, 120):
        page.mouse.move(cx, cy)
        worst = max(worst, _latency(page, lambda dy=dy: page.mouse.wheel(0, dy)))
    for dx in (80, -80, 80):
        page.mouse.move(cx, cy)
        page.mouse.down()

        def drag(dx=dx):
            page.mouse.move(cx + dx, cy + dx / 4)
        worst = max(worst, _latency(page, drag))
        page.mouse.up()
    return worst


def _screen(page: Any, js_world: str) -> tuple[float, float]:
    """Page coordinates of a world point (JS over ``v``)."""
    return tuple(page.evaluate(f"""() => {{ const v = {VIEW};
        const r = v.canvas.getBoundingClientRect(); const [x, y] = {js_world};
        const [sx, sy] = v.toScreen(x, y); return [r.left + sx, r.top + sy]; }}"""))


def _open_block(page: Any, block: str) -> dict[str, Any]:
    """Bring ``block``'s forward box into view, then open it with a real click."""
    page.evaluate(f"""() => {{ const v = {VIEW}, g = v.P.groups.name.indexOf({block!r});
        const f = v.boxRect(g * 2), b = v.boxRect(g * 2 + 1);  // both bands in view
        v.zoomTo(Math.min(f[0], b[0]) - 20, Math.min(f[1], b[1]), Math.max(f[2], b[2]) + 20,
                 Math.max(f[3], b[3])); }}""")
    page.evaluate(SETTLE)
    before = page.evaluate(f"() => {VIEW}.state()")
    xy = _screen(page, f"""(() => {{ const r = v.boxRect(v.P.groups.name.indexOf({block!r}) * 2);
        return [(r[0] + r[2]) / 2, (r[1] + r[3]) / 2]; }})()""")
    ms = _latency(page, lambda: page.mouse.click(*xy))
    after = page.evaluate(f"() => {VIEW}.state()")
    g = page.evaluate(f"""() => {{ const v = {VIEW}, G = v.P.groups, g = G.name.indexOf({block!r});
        return [G.count_f[g] + G.count_b[g], v.expanded[g]]; }}""")
    return {"ms": ms, "layout_ms": after["layoutMs"],
            "items": after["visibleNodes"] + after["visibleBoxes"],
            "nodes": after["visibleNodes"] - before["visibleNodes"],
            "boxes": after["visibleBoxes"] - before["visibleBoxes"], "size": g[0],
            "opened": bool(g[1])}


def _search(page: Any, query: str) -> dict[str, Any]:
    """Type ``query`` and press Enter; latency, hits, and whether the current hit is on screen
    with its whole label drawn (the view centres one hit at a time; Enter steps to the next)."""
    page.fill(".jl-search", query)
    ms = _latency(page, lambda: page.press(".jl-search", "Enter"))
    seen = page.evaluate(f"""() => {{ const v = {VIEW}, c = v.canvas, i = v.current;
        const [sx, sy] = v.toScreen(...v.itemXY(v.itemOf[i]));
        const on = sx >= 0 && sy >= 0 && sx <= c.clientWidth && sy <= c.clientHeight;
        const lab = (v.pinnedLabels || []).find(p => p.name === v.P.nodes.name[i]);
        return [v.hits.size, on, !!lab && lab.text === v.P.tables.label[v.P.nodes.label[i]]]; }}""")
    return {"ms": ms, "hits": seen[0], "current_on_screen": seen[1], "labelled": seen[2],
            "count": page.locator(".jl-count").text_content()}


def browser_rows(html_path: pathlib.Path, block: str, name: str, op: str) -> dict[str, Any]:
    """Every browser measurement on one page of the 50k-node view."""
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            tempfile.mkdtemp(), executable_path=CHROMIUM, args=FLAGS, headless=True,
            viewport={"width": 1400, "height": 760})
        page = ctx.new_page()
        page.goto(html_path.as_uri(), timeout=300_000)
        page.wait_for_function("() => { const d = document.querySelector('.jl-dag');"
                               " return d && d.jlView && d.jlView.firstFrameEnd !== undefined }",
                               timeout=300_000)
        out["first"] = page.evaluate(f"() => {VIEW}.firstFrameEnd")
        out["collapsed"] = page.evaluate(f"() => {VIEW}.state()")
        page.screenshot(path=str(SHOTS / "collapsed_50k.png"))
        page.evaluate(WATCH)
        page.get_by_role("button", name="fit").click()
        page.evaluate(SETTLE)
        page.screenshot(path=str(SHOTS / "collapsed_50k_fit.png"))
        out["frame_out"] = _frames(page)
        out["open"] = _open_block(page, block)
        page.screenshot(path=str(SHOTS / "expanded_block.png"))
        page.evaluate(f"""() => {{ const v = {VIEW}, g = v.P.groups.name.indexOf({block!r});
            const r = v.boxRect(g * 2); v.zoomTo(r[0], r[1], r[0] + 40, r[3]); }}""")
        page.evaluate(SETTLE)
        out["labels"] = page.evaluate(f"() => {VIEW}.state().labelCount")
        page.screenshot(path=str(SHOTS / "zoomed_labels.png"))
        out["frame_labels"] = _frames(page)
        out["search_name"] = _search(page, name)
        out["search_op"] = _search(page, op)
        page.screenshot(path=str(SHOTS / "search_op.png"))
        page.evaluate(f"() => {{ const v = {VIEW}; v.expanded.fill(1); v.update(); v.fit(); }}")
        page.evaluate(SETTLE)
        out["layout_all"] = page.evaluate(f"() => {VIEW}.state()")
        page.screenshot(path=str(SHOTS / "all_open_50k.png"))
        out["frame_all"] = _frames(page)
        ctx.close()
    return out


# -- first figure in a fresh process ------------------------------------------------------
FIRST_FIGURE_CODE = """
import sys, time, json
sys.path.insert(0, {root!r})
import jointlab as jl
from tests.fixtures import zoo
f = zoo.FIXTURES["tiny_lm"]
j = jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))
t, c = time.perf_counter(), time.process_time()
if {which!r} == "plot_dag":
    import warnings
    warnings.simplefilter("ignore", DeprecationWarning)
    bundle = {{"text/html": jl.plot_dag(j)._repr_html_()}}  # dag_view's alias
else:
    bundle = {{"text/html": jl.dag_view(j)._repr_html_()}}
s, cpu = time.perf_counter() - t, time.process_time() - c
heavy = sorted(m for m in ("jsonschema", "rfc3987_syntax", "nbformat") if m in sys.modules)
print(json.dumps({{"s": s, "cpu": cpu, "heavy": heavy, "mime": sorted(bundle)}}))
"""


def first_figure(which: str, runs: int = 3) -> tuple[float, float, list[str]]:
    """Median wall and CPU seconds over fresh processes from a traced graph to its bundle."""
    times, cpus, heavy = [], [], set()
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", FIRST_FIGURE_CODE.format(
            root=str(ROOT), which=which)], check=True, capture_output=True, text=True)
        res = json.loads(out.stdout.strip().splitlines()[-1])
        times.append(res["s"])
        cpus.append(res["cpu"])
        heavy.update(res["heavy"])
    return statistics.median(times), statistics.median(cpus), sorted(heavy)


# -- rows ---------------------------------------------------------------------------------
def _has_browser() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return os.path.exists(CHROMIUM)


def _targets(joint: Any) -> tuple[str, str, str]:
    """A middle transformer block, one node name inside it, and an op with one hit per layer."""
    from jointlab import meta

    blocks = sorted({".".join(meta.module(n).split(".")[:2]) for n in joint.graph.nodes
                     if meta.module(n).startswith("h.")}, key=lambda b: int(b.split(".")[1]))
    block = blocks[len(blocks) // 2]
    name = next(n.name for n in joint.graph.nodes if meta.module(n).startswith(block + ".")
                and meta.op_name(n) == "mm")
    return block, name, "gelu_backward"


def big_rows() -> list[dict[str, Any]]:
    """Rows for the ~50k-node view: page size and the browser timings."""
    from jointlab.viz.dagview import dag_view

    t = time.perf_counter()
    big = deep_joint(BIG_LAYERS)
    got = time.perf_counter() - t
    n = len(big.graph.nodes)
    t = time.perf_counter()
    view = dag_view(big)
    build = time.perf_counter() - t
    out = []
    with tempfile.TemporaryDirectory() as d:
        path = view.write_html(pathlib.Path(d) / "view50k.html")
        mb = os.path.getsize(path) / 2**20
        out.append(row(f"dag_view {n} nodes: page size", mb, "MB", "<= 5", mb <= 5,
                       detail=f"dag_view build {build:.2f} s (graph traced/loaded {got:.0f} s)"))
        if not _has_browser():
            return out + [row("dag_view 50k: browser rows (skipped: no chromium/playwright)",
                              float("nan"), "ms", "", None)]
        block, name, op = _targets(big)
        v = browser_rows(path, block, name, op)
    c, o = v["collapsed"], v["open"]
    out += [
        row("dag_view 50k: first paint (collapsed)", v["first"] / 1e3, "s", "<= 3",
            v["first"] <= 3000, detail=f"{c['visibleBoxes']} boxes, {c['visibleNodes']} nodes"),
        row(f"dag_view 50k: open {block} by a click", o["ms"], "ms", "<= 300",
            o["ms"] <= 300 and o["opened"],
            detail=f"group of {o['size']} nodes: +{o['nodes']} nodes, +{o['boxes']} boxes"),
        row("dag_view 50k: layout of the visible items after that open", o["layout_ms"], "ms",
            "", None, detail=f"{o['items']} items"),
        row("dag_view 50k: layout with every group open", v["layout_all"]["layoutMs"], "ms",
            "", None, detail=f"{v['layout_all']['visibleNodes']} items (the whole graph)"),
        row("dag_view 50k: zoom/pan frame, fit view (collapsed)", v["frame_out"], "ms", "<= 100",
            v["frame_out"] <= 100),
        row("dag_view 50k: zoom/pan frame, label zoom", v["frame_labels"], "ms", "<= 100",
            v["frame_labels"] <= 100, detail=f"{v['labels']} node labels drawn"),
        row("dag_view 50k: zoom/pan frame, all groups open, fit", v["frame_all"], "ms",
            "<= 100", v["frame_all"] <= 100),
    ]
    for key, what in (("search_name", name), ("search_op", op)):
        s = v[key]
        ok = s["current_on_screen"] and s["labelled"] and s["count"] == f"1 of {s['hits']}"
        out.append(row(f"dag_view 50k: search {what!r} to highlighted+zoomed", s["ms"], "ms",
                       "<= 1000", s["ms"] <= 1000 and s["hits"] > 0 and ok,
                       detail=f"{s['hits']} hits ({s['count']}), current hit on screen "
                              f"{s['current_on_screen']}, whole label {s['labelled']}"))
    return out


def layout_rows(ctx: Any) -> list[dict[str, Any]]:
    """Layout and the whole dag_view build of the 12-layer GPT-2 as shares of its trace."""
    import numpy as np

    from jointlab.viz import _layout
    from jointlab.viz._dagdata import graph_data
    from jointlab.viz.dagview import build_payload

    joint, trace_s = ctx.gpt2_joint, ctx.gpt2_trace_s
    d = graph_data(joint)
    lay = timeit(lambda: _layout.layered_layout(d.is_bwd, np.asarray(d.src), np.asarray(d.dst),
                                                d.twin), repeat=3)
    build = timeit(lambda: build_payload(joint), repeat=3)
    n = len(joint.graph.nodes)
    return [row("gpt2-12L: layered layout / jl.trace", lay / trace_s, "x", "<= 0.25",
                lay / trace_s <= 0.25, detail=f"{n} nodes, {lay * 1e3:.0f} ms vs {trace_s:.2f} s"),
            row("gpt2-12L: dag_view payload build / jl.trace", build / trace_s, "x", "<= 0.25",
                build / trace_s <= 0.25, detail=f"{build * 1e3:.0f} ms")]


def first_figure_rows() -> list[dict[str, Any]]:
    """The first figure in fresh processes, and whether the slow import chain ran."""
    out = []
    for which in ("plot_dag", "dag_view"):
        s, cpu, heavy = first_figure(which)
        load = os.getloadavg()[0]
        out.append(row(f"first {which} in a fresh process (median of 3)", s, "s", "<= 2",
                       s <= 2 and not heavy, detail=f"CPU {cpu:.2f} s, load average {load:.1f}; "
                       f"imported {heavy or 'none'} of jsonschema/rfc3987_syntax/nbformat"))
    return out


def rows(ctx: Any) -> list[dict[str, Any]]:
    """All rows (see the module docstring)."""
    return big_rows() + layout_rows(ctx) + first_figure_rows()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if len(sys.argv) > 1 and sys.argv[1].isdigit():
        BIG_LAYERS = int(sys.argv[1])
    which = sys.argv[2:] or ["big", "layout", "first"]
    from run import Context

    got = ((big_rows() if "big" in which else []) +
           (layout_rows(Context()) if "layout" in which else []) +
           (first_figure_rows() if "first" in which else []))
    for r in got:
        mark = {True: "ok", False: "MISS", None: ""}[r["ok"]]
        print(f"{r['name']:<60} {r['value']:>10.4g} {r['unit']:<4} {r['target']:<8} {mark}"
              f"  {r.get('detail', '')}", flush=True)
