"""JupyterLab in headless Chromium: run the quickstart and debugging notebooks for real.

Starts JupyterLab from this environment on a free localhost port with a token,
opens *copies* of ``01_quickstart`` and ``03_debugging`` (kernels outlive pages),
runs all cells and checks what a user sees: the DAG and memory plots, the node
table, the stepper panel's Step button advancing its position label, no
error outputs and no JavaScript errors. Screenshots go to a temp dir and to
``$JOINTLAB_SCREENSHOTS`` when set. Recipe: ../shared/notes/browser-testing.md.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.chromium import (
    PageErrors,
    browser,
    chromium_path,
    code_notebook,
    dag_layout,
    dag_screen_of,
    dag_state,
    open_dag_page,
    save_screenshot,
)

pytestmark = pytest.mark.browser
NOTEBOOKS = pathlib.Path(__file__).parent.parent / "notebooks"
RUN_TIMEOUT_MS = 420_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    chromium_path()  # skip before starting a server when there is no browser
    root = tmp_path_factory.mktemp("lab")
    cfg = root / ".config"
    (cfg / "labconfig").mkdir(parents=True)
    (cfg / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    # Render every cell up front (no windowing), so the DOM holds all prompts.
    settings = root / ".settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    token, port = secrets.token_hex(16), _free_port()
    # The kernel imports this checkout's jointlab (not whichever one is installed).
    path = os.pathsep.join(p for p in (str(NOTEBOOKS.parent), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path,
           "JUPYTER_CONFIG_DIR": str(cfg), "JUPYTER_RUNTIME_DIR": str(root / ".rt"),
           "IPYTHONDIR": str(root / ".ipython"), "JUPYTER_PLATFORM_DIRS": "1"}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
           f"--ServerApp.token={token}", f"--port={port}", "--ip=127.0.0.1",
           f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           f"--LabApp.workspaces_dir={root / '.ws'}",
           f"--LabApp.user_settings_dir={root / '.settings'}"]
    log = open(root / "server.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log_text = (root / "server.log").read_text()
                raise RuntimeError("JupyterLab did not start:\n" + log_text)
            time.sleep(0.5)
        yield {"base": base, "token": token, "root": root}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server's own group: it and its kernels
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def _open_and_run_all(lab, b, name: str, src: pathlib.Path | None = None, min_cells: int = 6):
    src = src or NOTEBOOKS / f"{name}.ipynb"
    copy = f"{name}-{secrets.token_hex(3)}.ipynb"
    shutil.copy(src, lab["root"] / copy)
    page = b.new_page(viewport={"width": 1400, "height": 1000})
    errors = PageErrors(page)
    page.goto(f"{lab['base']}/lab/tree/{copy}?reset&token={lab['token']}")
    idle = page.locator(".jp-StatusBar-Widget", has_text=re.compile(r"\| Idle"))
    idle.first.wait_for(timeout=120_000)
    # The number of code cells comes from the file, not from what has rendered so far.
    cells = json.loads(src.read_text())["cells"]
    n_code = sum(c["cell_type"] == "code" for c in cells)
    assert n_code >= min_cells
    page.wait_for_function(
        "n => document.querySelectorAll('.jp-Notebook .jp-CodeCell').length === n",
        arg=n_code, timeout=120_000)
    for attempt in range(3):  # the menu click can race the kernel's start-up: retry once or twice
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        try:
            page.wait_for_function(
                "() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
                ".some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))", timeout=30_000)
            break
        except Exception:  # noqa: BLE001 - nothing started: click again
            if attempt == 2:
                raise
    try:
        page.wait_for_function(
            """n => {
                const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
                return prompts.length === n && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
            }""", arg=n_code, timeout=RUN_TIMEOUT_MS, polling=1000)
    except Exception as exc:  # say where the run stopped, and keep a picture of it
        prompts = page.eval_on_selector_all(
            ".jp-CodeCell .jp-InputPrompt", "ps => ps.map(p => p.textContent.trim())")
        status = page.locator(".jp-StatusBar-Widget").all_inner_texts()
        shot = save_screenshot(page, lab["root"], f"{name}_stalled")
        raise AssertionError(f"cells did not all run: prompts={prompts} status={status} "
                             f"screenshot={shot}") from exc
    idle.first.wait_for(timeout=120_000)
    return page, errors


def _assert_no_error_outputs(page) -> None:
    texts = page.locator(".jp-OutputArea-output").all_text_contents()
    bad = [t[:500] for t in texts if "Traceback" in t or "Error:" in t.split("\n", 1)[0]]
    assert bad == [], bad


def _plot_titles(page) -> list[str]:
    return page.locator(".jl-plot svg text.title").all_text_contents()


VIEW_STATE = """els => els.map(p => { const v = p.jlView, c = v.canvas;
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let ink = 0; for (let k = 3; k < d.length; k += 4) if (d[k] > 0) ink++;
    return {nodes: v.visNodes.length, boxes: v.visBoxes.length, ink,
            area: c.width * c.height}; })"""


def _dag_views(page, at_least: int) -> list[dict]:
    """The page's ``dag_view`` outputs once drawn: visible nodes and boxes, canvas ink."""
    for k in range(at_least):  # a view paints when it is scrolled into sight
        page.locator(".jp-OutputArea-output .jl-dag").nth(k).scroll_into_view_if_needed()
        page.wait_for_function(
            "k => { const d = document.querySelectorAll('.jp-OutputArea-output .jl-dag')[k];"
            " return d && d.jlView && d.jlView.lastFrameMs !== undefined }", arg=k,
            timeout=120_000)
    return page.eval_on_selector_all(".jp-OutputArea-output .jl-dag", VIEW_STATE)


def test_quickstart_in_jupyterlab(lab, tmp_path):
    t0 = time.perf_counter()
    with browser() as b:
        page, errors = _open_and_run_all(lab, b, "01_quickstart")
        _assert_no_error_outputs(page)
        page.locator(".jl-plot svg").first.wait_for(timeout=60_000)  # plot_memory's SVG
        titles = _plot_titles(page)
        assert any(t.startswith("Memory per node step") for t in titles), titles
        dags = _dag_views(page, 2)  # the whole graph, then a budget-collapsed view
        assert all(d is not None and d["nodes"] + d["boxes"] > 0 for d in dags), dags
        assert all(d["ink"] > 0.01 * d["area"] for d in dags), dags
        table = page.locator(".jp-OutputArea-output table.dataframe")
        assert table.count() >= 3 and table.first.locator("tbody tr").count() >= 10
        text = table.first.text_content()
        # the node table's own data: its columns and the model's block modules
        assert "saved_for_backward" in text and re.search(r"\bh\.\d+\.(attn|mlp|ln_\d)", text)
        card = page.locator(".jp-OutputArea-output", has_text="JointGraph").first
        card.scroll_into_view_if_needed()
        save_screenshot(page, tmp_path, "01_quickstart_top")
        page.locator(".jp-OutputArea-output .jl-dag").first.evaluate(
            "el => el.scrollIntoView({block: 'center'})")
        page.wait_for_timeout(1000)  # cells scrolled into view paint lazily
        save_screenshot(page, tmp_path, "01_quickstart_dag")
        plot = page.locator(".jl-plot", has=page.locator(
            "text.title", has_text="Memory per node step"))
        plot.first.evaluate("el => el.scrollIntoView({block: 'center'})")
        page.wait_for_timeout(1000)
        save_screenshot(page, tmp_path, "01_quickstart_memory")
        table.first.scroll_into_view_if_needed()
        save_screenshot(page, tmp_path, "01_quickstart_table")
    print(f"\n[browser] 01_quickstart: {time.perf_counter() - t0:.1f} s")
    assert errors.errors == [], errors.errors


def test_debugging_stepper_in_jupyterlab(lab, tmp_path):
    t0 = time.perf_counter()
    with browser() as b:
        page, errors = _open_and_run_all(lab, b, "03_debugging")
        _assert_no_error_outputs(page)
        label = page.locator(".widget-label", has_text=re.compile(r"^position \d+ / \d+$"))
        label.first.wait_for(timeout=60_000)
        label.first.scroll_into_view_if_needed()
        before = label.first.text_content()
        start = int(re.search(r"position (\d+)", before).group(1))
        panel = page.locator(".widget-vbox", has=label.first).last
        step = panel.get_by_role("button", name="Step", exact=True)
        for k in (1, 2, 3):
            step.click()
            page.wait_for_function(
                "([el, want]) => el.textContent.startsWith('position ' + want + ' /')",
                arg=[label.first.element_handle(), start + k], timeout=60_000)
        assert label.first.text_content().startswith(f"position {start + 3} /")
        panel.evaluate("el => el.scrollIntoView({block: 'center'})")
        page.wait_for_timeout(500)
        save_screenshot(page, tmp_path, "03_debugging_stepper")
        dags = _dag_views(page, 2)  # the culprit marked, the gradient norms as a layer
        assert all(d is not None and d["ink"] > 0.01 * d["area"] for d in dags), dags
        page.locator(".jp-OutputArea-output .jl-dag").first.evaluate(
            "el => el.scrollIntoView({block: 'center'})")
        page.wait_for_timeout(1000)
        save_screenshot(page, tmp_path, "03_debugging_dag")
    print(f"\n[browser] 03_debugging: {time.perf_counter() - t0:.1f} s")
    assert errors.errors == [], errors.errors


# -- the bundled DAG renderer (dag_view), as in the offline report ------------------------
SHOTS = pathlib.Path(os.environ.get("JOINTLAB_DAG_SHOTS", "/tmp/dag_shots"))


def _view_page(b, path):
    return open_dag_page(b, path)


@pytest.fixture(scope="module")
def lm_joint():
    import jointlab as jl
    from tests.fixtures import zoo

    f = zoo.FIXTURES["tiny_lm"]
    return jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))


def test_dag_view_labels_expand_search_detail_wheel(lm_joint, tmp_path):
    import jointlab as jl
    from jointlab.viz.dagview import dag_view

    chromium_path()
    view = dag_view(lm_joint)
    path = view.write_html(tmp_path / "dag.html")
    nodes = list(lm_joint.graph.nodes)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with browser() as b:
        page, errors = _view_page(b, path)
        s = dag_state(page)
        assert s["visibleNodes"] == len(nodes) and s["visibleBoxes"] == 0  # fits the budget
        assert s["labelCount"] > 20
        assert {"wte.weight", "embedding"} <= set(s["labels"]), s["labels"]
        assert s["arrows"] > 20  # edges have direction
        page.screenshot(path=str(SHOTS / "teaching_labels.png"))
        # colour by module: each group's own colour, keyed by its name (viz._style), and
        # visible siblings (same parent, at most 20 of them) never share one
        G = view.payload["groups"]
        pal = view.payload["palette"]
        assert s["moduleColors"] == {m: pal[G["color"][G["name"].index(m)]]
                                     for m in s["moduleColors"]}
        by_parent: dict = {}
        for m, c in s["moduleColors"].items():
            by_parent.setdefault(G["parent"][G["name"].index(m)], []).append(c)
        assert len(by_parent) > 3 and all(len(set(c)) == len(c) for c in by_parent.values())
        # collapse everything, then open h.0 by clicking its forward box
        page.get_by_role("button", name="collapse all").click()
        closed = dag_state(page)
        assert closed["visibleNodes"] < len(nodes) and closed["visibleBoxes"] > 2
        for group in ("h", "h.0"):  # h holds only the blocks; h.0 has nodes of its own
            xy = dag_screen_of(page, f"""(() => {{ const g = v.P.groups.name.indexOf('{group}');
                const r = v.boxRect(g * 2); return [(r[0] + r[2]) / 2, (r[1] + r[3]) / 2]; }})()""")
            page.mouse.click(*xy)
        opened = dag_state(page)
        own = sum(jl.meta.module(n) == "h.0" for n in nodes)  # h.0's own nodes, both bands
        assert own > 0 and opened["visibleNodes"] == closed["visibleNodes"] + own
        assert opened["visibleBoxes"] > closed["visibleBoxes"]  # h.0's submodules, h.1, ...
        assert "h.0 ▾" in page.evaluate(
            "() => document.querySelector('.jl-dag').jlView.titles.map(t => "
            "document.querySelector('.jl-dag').jlView.P.groups.name[t[0]] + ' ▾')")
        page.screenshot(path=str(SHOTS / "teaching_expanded_block.png"))
        # search an op: highlighted; each hit in turn (Enter steps) opened and in the viewport
        want = [n.name for n in nodes if jl.meta.op_name(n) == "embedding_dense_backward"]
        page.fill(".jl-search", "embedding_dense_backward")
        page.press(".jl-search", "Enter")
        s = dag_state(page)
        assert s["hits"] == len(want) >= 1
        for k, name in enumerate(want):
            if k:
                page.press(".jl-search", "Enter")
                dag_state(page)
            inside = page.evaluate(f"""() => {{ const v = document.querySelector('.jl-dag').jlView;
                const i = v.P.nodes.name.indexOf({name!r}); if (v.itemOf[i] !== i) return false;
                const [sx, sy] = v.toScreen(v.x[i], v.y[i]);
                const c = v.canvas;
                return sx >= 0 && sy >= 0 && sx <= c.clientWidth && sy <= c.clientHeight
                    && v.hits.has(i); }}""")
            assert inside, name
        # the detail panel of a backward node names its forward twin
        node = next(n for n in nodes if jl.meta.info(n).get("fwd_twin")
                    and jl.meta.op_name(n) == "embedding_dense_backward")
        twin = jl.meta.info(node)["fwd_twin"]
        page.mouse.click(*dag_screen_of(page, f"(() => {{ const i = v.P.nodes.name.indexOf("
                                           f"{node.name!r}); return [v.x[i], v.y[i]]; }})()"))
        panel = page.locator(".jl-detail")
        assert panel.locator(".jl-detail-name").text_content() == node.name
        assert panel.locator(".jl-twin .jl-link").first.text_content() == twin
        page.screenshot(path=str(SHOTS / "detail_panel.png"))
        # the wheel zooms
        k0 = dag_state(page)["k"]
        box = page.locator(".jl-canvas").bounding_box()
        page.mouse.move(box["x"] + 300, box["y"] + 200)
        page.mouse.wheel(0, -400)
        assert dag_state(page)["k"] > k0 * 1.3
        assert errors.errors == [], errors.errors


def _expected_items(joint, payload, expanded):
    """Visible items and their edges, computed from the graph itself as the view should show it.

    A node is drawn as itself when every group on its module path is open, else as the box
    (one per band) of the outermost closed group on that path.
    """
    import jointlab as jl

    groups, g_of = payload["groups"], payload["nodes"]["g"]
    nodes = list(joint.graph.nodes)
    item = {}
    for n, g in zip(nodes, g_of):
        path = []
        while g >= 0:
            path.append(g)
            g = groups["parent"][g]
        closed = [g for g in reversed(path) if not expanded[g]]
        bwd = jl.meta.phase(n) in ("backward", "output")
        item[n] = (groups["name"][closed[0]] + ("#b" if bwd else "#f")) if closed else n.name
    edges = {(item[a], item[n]) for n in nodes for a in n.all_input_nodes if item[a] != item[n]}
    return set(item.values()), edges


def _overlaps(items):
    """Pairs of visible items whose world rectangles intersect (sweep over x)."""
    order = sorted(items, key=lambda it: it["rect"][0])
    out, active = [], []
    for it in order:
        x0, y0, x1, y1 = it["rect"]
        active = [a for a in active if a["rect"][2] > x0]
        out += [(a["id"], it["id"]) for a in active if a["rect"][1] < y1 and y0 < a["rect"][3]]
        active.append(it)
    return out


def _inside(r, o):
    """World rect ``r`` lies strictly inside rect ``o``."""
    return o[0] < r[0] and o[1] < r[1] and r[2] < o[2] and r[3] < o[3]


def _meets(r, o):
    return r[0] < o[2] and o[0] < r[2] and r[1] < o[3] and o[1] < r[3]


def _check_outlines(payload, lay, stage):
    """Open-group outlines: one per open group and band with visible items, holding exactly them.

    Siblings (and anything not nested, in either band) are disjoint, a child's outline lies
    inside its parent's, and no outline meets an item of another group.
    """
    names, parent = payload["groups"]["name"], payload["groups"]["parent"]
    index = {n: k for k, n in enumerate(names)}

    def path(g):  # the group and its ancestors, root excluded
        out = []
        while g > 0:
            out.append(g)
            g = parent[g]
        return out

    items = [(it, set(path(index[it["group"]]))) for it in lay["items"]]
    want = {(g, it["band"]) for it, gs in items for g in gs if lay["expanded"][g]}
    outl = {(index[o["group"]], o["band"]): o["rect"] for o in lay["outlines"]}
    assert set(outl) == want and len(outl) == len(lay["outlines"]), stage
    for (g, band), rect in outl.items():
        for it, gs in items:
            holds = g in gs and it["band"] == band
            assert (_inside(it["rect"], rect) if holds else not _meets(it["rect"], rect)), \
                (stage, names[g], band, it["id"])
        for (h, hb), other in outl.items():
            if (h, hb) == (g, band):
                continue
            if hb == band and g in path(h):  # h nested in g
                assert _inside(other, rect), (stage, names[h], "not inside", names[g], band)
            elif not (hb == band and h in path(g)):
                assert not _meets(other, rect), (stage, names[h], hb, "meets", names[g], band)


def _check_layout(joint, payload, lay, stage):
    """No two visible items overlap; the items and edges are the graph's; forward edges go right.

    Open groups' outlines are nested and disjoint (``_check_outlines``).
    """
    assert _overlaps(lay["items"]) == [], stage
    _check_outlines(payload, lay, stage)
    want_items, want_edges = _expected_items(joint, payload, lay["expanded"])
    ids = [it["id"] for it in lay["items"]]
    got_edges = {(ids[a], ids[b]) for a, b in zip(lay["edges"][::2], lay["edges"][1::2])}
    assert set(ids) == want_items and len(ids) == len(want_items), stage
    assert got_edges == want_edges, stage
    fwd = [(lay["items"][a], lay["items"][b]) for a, b in zip(lay["edges"][::2], lay["edges"][1::2])
           if lay["items"][a]["band"] == lay["items"][b]["band"] == 0]
    assert fwd, stage
    for a, b in fwd:  # layers follow the topological order, drawn left to right
        assert a["layer"] < b["layer"] and a["rect"][2] < b["rect"][0], (stage, a["id"], b["id"])


@pytest.fixture(scope="module")
def gpt2_joint():
    import jointlab as jl
    from tests.fixtures import real

    f = real.get("hf_gpt2")
    return jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))


VIEW_JS = "const v = document.querySelector('.jl-dag').jlView"
PAN_TO_GROUP = VIEW_JS + """, r = v.groupRect(v.P.groups.name.indexOf(name), band);
    v.detail.style.display = "none";  // as a user would: pan it to the canvas' left part
    v.vx = r[0] - 0.2 * v.canvas.clientWidth / v.k;
    v.vy = (r[1] + r[3]) / 2 + 0.5 * v.canvas.clientHeight / (v.k * v.ay); v.render();
    const [a, t] = v.toScreen(r[0], r[3]), [z, u] = v.toScreen(r[2], r[1]);
    const c = v.canvas.getBoundingClientRect(), g = v.P.groups.name.indexOf(name);
    const ti = v.titles.find(t => t[0] === g && t[5] === band);  // canvas pixels
    const at = title ? [ti[1] + 4, (ti[2] + ti[4]) / 2] : [(a + z) / 2, (t + u) / 2];
    return {rect: [a, t, z, u], click: [c.left + at[0], c.top + at[1]]};"""


def _click_group(page, name: str, band: int, title: bool = False) -> list[float]:
    """Pan to a group, click its box (or its title when open); its screen rect before."""
    got = page.evaluate(f"([name, band, title]) => {{ {PAN_TO_GROUP} }}", [name, band, title])
    page.mouse.click(*got["click"])
    return got["rect"]


def _group_screen_left(page, name: str, band: int) -> float:
    return page.evaluate(f"""() => {{ const v = document.querySelector('.jl-dag').jlView;
        const r = v.groupRect(v.P.groups.name.indexOf({name!r}), {band});
        return v.toScreen(r[0], r[1])[0]; }}""")


def test_dag_view_lays_out_the_visible_graph_without_overlaps(gpt2_joint, tmp_path):
    from jointlab.viz.dagview import dag_view

    chromium_path()
    view = dag_view(gpt2_joint, budget=60)  # opens grouped: transformer, lm_head closed
    path = view.write_html(tmp_path / "gpt2.html")
    groups = view.payload["groups"]
    SHOTS.mkdir(parents=True, exist_ok=True)
    with browser() as b:
        page, errors = _view_page(b, path)
        lay = dag_layout(page)
        assert any(it["box"] for it in lay["items"]), "the view should open grouped"
        _check_layout(gpt2_joint, view.payload, lay, "open")
        # open two groups by clicking their boxes (the second in the backward band)
        for name, band in (("transformer", 0), ("transformer.h", 1)):
            before = _click_group(page, name, band)
            lay = dag_layout(page)
            g = groups["name"].index(name)
            assert lay["expanded"][g], name
            _check_layout(gpt2_joint, view.payload, lay, f"opened {name}")
            # every child group (as its box, or open: as its outline) and every own node
            # of the opened group is now visible
            ids = {it["id"].split("#")[0] for it in lay["items"]}
            kids = [k for k, p in enumerate(groups["parent"]) if p == g]
            shown = {groups["name"][k] for k in kids
                     if groups["name"][k] in ids or lay["expanded"][k]}
            own = [n.name for n, gg in zip(gpt2_joint.graph.nodes, view.payload["nodes"]["g"])
                   if gg == g]
            assert kids and shown == {groups["name"][k] for k in kids}, (name, shown)
            assert set(own) <= ids, name
            # opened in place: its outline starts where its box started on screen (within
            # 1.5 px: at this zoom, k~17, the open outline of 'transformer' lands 1.0 px left
            # of its box since the trace takes eager's causal-mask shortcut; not explained yet)
            assert _group_screen_left(page, name, band) == pytest.approx(before[0], abs=1.5)
        page.screenshot(path=str(SHOTS / "gpt2_two_groups_open.png"))
        # and close the second again by clicking its title
        _click_group(page, "transformer.h", 1, title=True)
        lay = dag_layout(page)
        assert not lay["expanded"][groups["name"].index("transformer.h")]
        _check_layout(gpt2_joint, view.payload, lay, "closed transformer.h")
        assert "transformer.h#b" in {it["id"] for it in lay["items"]}
    assert errors.errors == [], errors.errors


def test_dag_view_open_group_outlines_nest_without_overlaps(tmp_path):
    """The demo GPT opens with every group open: outlines nest, siblings never overlap."""
    import jointlab as jl
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2
    from jointlab.viz.dagview import dag_view

    chromium_path()
    joint = jl.trace(make_gpt2(n_layer=2, d=32, n_head=4, vocab=64, seq=8), lm_train_fn,
                     lm_inputs(2, 64, 8))
    view = dag_view(joint)
    path = view.write_html(tmp_path / "demo.html")
    names = view.payload["groups"]["name"]
    with browser() as b:
        page, errors = _view_page(b, path)
        lay = dag_layout(page)
        assert not any(it["box"] for it in lay["items"]), "the demo view opens with all open"
        assert len(lay["outlines"]) > 20
        _check_layout(joint, view.payload, lay, "all open")
        # close two groups by their titles (one in each band), then open one again by its box
        for name, band, title in (("h.0", 0, True), ("h.1.attn", 1, True), ("h.0", 0, False)):
            _click_group(page, name, band, title=title)
            lay = dag_layout(page)
            assert lay["expanded"][names.index(name)] == (not title), name
            _check_layout(joint, view.payload, lay, f"{'closed' if title else 'opened'} {name}")
        page.screenshot(path=str(SHOTS / "demo_outlines.png"))
    assert errors.errors == [], errors.errors


REPO = pathlib.Path(__file__).resolve().parent.parent
DAGVIEW_SHOTS = pathlib.Path(os.environ.get("JOINTLAB_DAGVIEW_SHOTS", "/tmp/dagviews_shots"))
EXPLORE_REF = """import json
nodes = list(joint.graph.nodes)
ph = {n.name: jl.meta.phase(n) for n in nodes}
mod = {n.name: jl.meta.module(n) for n in nodes}
pairs = {(a.name, n.name) for n in nodes for a in n.all_input_nodes}
hits = [n.name for n in nodes if 'addmm' in str(jl.meta.info(n).get('target', '')).lower()
        or 'addmm' in mod[n.name].lower() or 'addmm' in n.name.lower()]
in_h = [n for n in ph if ph[n] not in ('backward', 'output') and jl.meta.in_module(mod[n], 'h')]
print('REF_JSON=' + json.dumps({
    'nodes': len(nodes), 'edges': len(pairs),
    'fwd_nodes': sum(p != 'backward' for p in ph.values()),
    'fwd_edges': sum(ph[a] != 'backward' and ph[b] != 'backward' for a, b in pairs),
    'hits': len(hits), 'hit_groups': sorted({mod[n].split('.')[0] for n in hits if mod[n]}),
    'h_band0': len(in_h), 'h_band0_noparam': sum(ph[n] != 'param' for n in in_h),
    'twin': next([n.name, jl.meta.info(n)['fwd_twin']] for n in nodes
                 if jl.meta.info(n).get('fwd_twin') and ph[n.name] == 'backward')}))"""
EXPLORE_CELLS = [
    f"import sys; sys.path.insert(0, {str(REPO)!r})",
    "import jointlab as jl\nfrom tests.fixtures import zoo\nf = zoo.FIXTURES['tiny_lm']\n"
    "joint = jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))",
    "w = jl.explore(joint)\nw",
    EXPLORE_REF,
]


def _explore_notebook(path: pathlib.Path) -> pathlib.Path:
    return code_notebook(path, EXPLORE_CELLS)


def _selected_label(select) -> str:
    """The shown option of a ``<select>`` (ipywidgets writes spaces as no-break spaces)."""
    text = select.evaluate("s => s.selectedIndex < 0 ? '' : s.options[s.selectedIndex].text")
    return text.replace("\xa0", " ")


def _kernel_json(page, marker: str) -> dict:
    """The JSON a cell printed after ``marker`` (the kernel's own reference figures)."""
    out = page.locator(".jp-OutputArea-output", has_text=re.compile(re.escape(marker)))
    out = out.first.text_content()
    return json.loads(out.split(marker, 1)[1].splitlines()[0])


EXPLORE_VIEW = "document.querySelector('.jl-explore-dag').jlView"


def _explore_state(page) -> dict:
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")
    return page.evaluate(f"""() => {{ const v = {EXPLORE_VIEW};
        return {{nodes: v.visNodes.length, edges: v.visEdges.length / 2, boxes: v.visBoxes.length,
                 labels: v.drawnLabels.length, hits: v.hits.size,
                 hitGroups: [...(v.hitBoxes || [])].map(b => v.P.groups.name[b >> 1]).sort(),
                 shownPhases: [...new Set(v.visNodes.map(i => v.P.tables.phase[v.P.nodes.ph[i]]))],
                 hCount: v.P.groups.count_f[v.P.groups.name.indexOf('h')]}}; }}""")


def _wait_view(page, cond: str) -> None:
    page.wait_for_function(f"() => {{ const v = {EXPLORE_VIEW}; return v && ({cond}); }}",
                           timeout=30_000)


def test_explore_dropdown_title_and_grouped_search_in_jupyterlab(lab, tmp_path):
    DAGVIEW_SHOTS.mkdir(parents=True, exist_ok=True)
    src = _explore_notebook(tmp_path / "explore.ipynb")
    with browser() as b:
        page, errors = _open_and_run_all(lab, b, "explore", src=src, min_cells=4)
        _assert_no_error_outputs(page)
        ref = _kernel_json(page, "REF_JSON=")
        select = page.locator(".widget-dropdown select").first
        select.wait_for(timeout=60_000)
        page.wait_for_function("() => document.querySelector('.jl-explore-dag')?.dataset.ready",
                               timeout=60_000)
        select.scroll_into_view_if_needed()
        assert _selected_label(select) == "all nodes"
        title = page.locator(".jl-explore-dag .jl-title")
        assert title.is_visible() and title.text_content().startswith("Joint graph:")
        assert page.locator(".jl-explore-dag .jl-search").is_hidden()  # explore's box only
        s = _explore_state(page)  # every node and edge of the kernel's graph, labelled
        assert (s["nodes"], s["edges"]) == (ref["nodes"], ref["edges"]) and s["labels"] > 20
        page.screenshot(path=str(DAGVIEW_SHOTS / "explore_default.png"))
        # a phase toggle hides its nodes and every edge that touches one
        backward = page.locator("button", has_text=re.compile(r"^backward$")).first
        backward.click()
        _wait_view(page, f"v.visNodes.length === {ref['fwd_nodes']}")
        s = _explore_state(page)
        assert (s["nodes"], s["edges"]) == (ref["fwd_nodes"], ref["fwd_edges"])
        assert "backward" not in s["shownPhases"]
        page.screenshot(path=str(DAGVIEW_SHOTS / "explore_backward_hidden.png"))
        backward.click()
        _wait_view(page, f"v.visNodes.length === {ref['nodes']}")
        # a click on the canvas selects the node and its twin in the kernel
        node, twin = ref["twin"]
        xy = page.evaluate(f"""() => {{ const v = {EXPLORE_VIEW}, i = v.index.get({node!r});
            const r = v.canvas.getBoundingClientRect(); v.vx = v.x[i] - r.width / 2 / v.k;
            v.vy = v.y[i] + r.height / 2 / (v.k * v.ay); v.render();
            const [sx, sy] = v.toScreen(v.x[i], v.y[i]); return [r.left + sx, r.top + sy]; }}""")
        page.mouse.click(*xy)
        status = page.locator(".widget-html", has_text="node(s) selected")
        status.first.wait_for(timeout=30_000)
        page.wait_for_function("([el, t]) => el.textContent.includes(t)",
                               arg=[status.first.element_handle(), twin], timeout=30_000)
        assert node in status.first.text_content()
        # grouped: search finds ops, the groups holding them are outlined
        select.select_option(label="depth 1")
        _wait_view(page, "v.visBoxes.length > 0")
        search = page.locator(".widget-text input").first
        search.fill("addmm")
        search.press("Enter")
        want = f"{ref['hits']} node(s) selected in {len(ref['hit_groups'])} group(s)"
        try:
            page.wait_for_function("([el, t]) => el.textContent.includes(t)",
                                   arg=[status.first.element_handle(), want], timeout=30_000)
        finally:
            assert want in status.first.text_content(), status.first.text_content()
        _wait_view(page, f"v.hits.size === {ref['hits']}")
        assert _explore_state(page)["hitGroups"] == ref["hit_groups"]
        assert _selected_label(select) == "depth 1"
        page.screenshot(path=str(DAGVIEW_SHOTS / "explore_grouped_search.png"))
        # param toggle while grouped: the boxes leave the parameters out of their counts
        assert _explore_state(page)["hCount"] == ref["h_band0"]
        page.locator("button", has_text=re.compile(r"^param$")).first.click()
        _wait_view(page, f"v.P.groups.count_f[v.P.groups.name.indexOf('h')] === "
                         f"{ref['h_band0_noparam']}")
        assert ref["h_band0_noparam"] < ref["h_band0"]
        page.locator("button", has_text=re.compile(r"^param$")).first.click()
        # the selection is kept across depths
        select.select_option(label="all nodes")
        _wait_view(page, f"v.visNodes.length === {ref['nodes']}")
        assert f"{ref['hits']} node(s) selected" in status.first.text_content()
        assert _explore_state(page)["hits"] == ref["hits"]
    assert errors.errors == [], errors.errors


# -- the stepper panel, opened several times ----------------------------------------------
PANEL_SHOTS = pathlib.Path(os.environ.get("JOINTLAB_PANEL_SHOTS", "/tmp/panel_shots"))
N_PANELS = 5
PANEL_SETUP = """import time
import torch.nn.functional as F
import jointlab as jl
from jointlab.models import lm_inputs, make_gpt2


def train_fn(model, input_ids, labels):
    logits = model(input_ids)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


model = make_gpt2(n_layer=2, d=32, n_head=4, vocab=128, seq=16)  # notebook 03's model
inputs = lm_inputs(2, vocab=128, seq=16)
joint = jl.trace(model, train_fn, inputs)
len(joint.graph.nodes)"""
PANEL_CELL = ("t0 = time.perf_counter()\n"
              "panel = jl.Stepper(joint, model, inputs, device='cpu', seed=0).widget()\n"
              "print(f'widget() {time.perf_counter() - t0:.2f} s')\npanel")
# eager's value of the first embedding, its statistics in numpy (not the panel's code)
PANEL_REF = """import json
import numpy as np
x = F.embedding(inputs['input_ids'], model.wte.weight).detach().double().numpy()
print('EMB_JSON=' + json.dumps({'shape': list(x.shape), 'mean': x.mean(), 'std': x.std(ddof=0),
                          'min': x.min(), 'max': x.max(), 'norm': float(np.sqrt((x * x).sum())),
                          'nan': int(np.isnan(x).sum()), 'inf': int(np.isinf(x).sum())}))
print('FIRST_PARAM_JSON=' + json.dumps(next(iter(dict(model.named_parameters())))))"""
DAG_STATE = """els => els.map(p => { const v = p.jlView; if (!v || !p.dataset.ready) return null;
    const c = v.canvas, d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let ink = 0; for (let k = 3; k < d.length; k += 4) if (d[k] > 0) ink++;
    return {nodes: v.visNodes.length, boxes: v.visBoxes.length, ink, area: c.width * c.height,
            ringed: v.selected >= 0 ? v.P.nodes.name[v.selected] : null}; })"""


def _panel_notebook(path: pathlib.Path) -> pathlib.Path:
    import nbformat

    cells = [nbformat.v4.new_code_cell(PANEL_SETUP)]
    cells += [nbformat.v4.new_code_cell(PANEL_CELL) for _ in range(N_PANELS)]
    cells.append(nbformat.v4.new_code_cell(PANEL_REF))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    return path


def _assert_dags_drawn(page, want_nodes: int) -> list[dict]:
    """Every panel's DAG is mounted, draws every node and has ink on its canvas."""
    try:
        page.wait_for_function(
            "n => [...document.querySelectorAll('.jl-stepper .jl-dag')]"
            ".filter(p => p.dataset.ready && p.jlView).length === n", arg=N_PANELS,
            timeout=120_000)
    except Exception as exc:  # say what is there
        seen = page.evaluate("() => [...document.querySelectorAll('.jl-stepper')].map(s => {"
                             " const d = s.querySelector('.jl-dag'); return d ? "
                             "{ready: !!d.dataset.ready, view: !!d.jlView, "
                             "connected: d.isConnected} : 'no dag'; })")
        shot = save_screenshot(page, PANEL_SHOTS, "stalled")
        raise AssertionError(f"panels: {seen}, screenshot {shot}") from exc
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")
    states = page.eval_on_selector_all(".jl-stepper .jl-dag", DAG_STATE)
    assert len(states) == N_PANELS, states
    for st in states:  # an empty grid has no ink; a drawn DAG of 300 nodes covers a few %
        assert st is not None and st["nodes"] == want_nodes, states
        assert st["ink"] > 0.02 * st["area"], states
    return states


def _current_name(panel) -> str:
    """The graph node the card shows (a placeholder shows its FQN, its graph name on hover)."""
    code = panel.locator(".jl-current .jl-head code").first
    hover = code.get_attribute("title") or ""
    return hover.removeprefix("graph node ") if hover else code.text_content()


def _panel_timing(page) -> float:
    """Seconds from running one panel cell again to its DAG drawn (kernel and browser)."""
    page.evaluate("() => document.querySelectorAll('.jl-dag').forEach(d => d.dataset.old = 1)")
    cell = page.locator(".jp-CodeCell").nth(1)
    cell.locator(".jp-InputArea-editor").click()
    t0 = time.perf_counter()
    page.keyboard.press("Control+Enter")
    page.wait_for_function("() => [...document.querySelectorAll('.jl-stepper .jl-dag')]"
                           ".some(d => !d.dataset.old && d.dataset.ready)", timeout=120_000)
    return time.perf_counter() - t0


def test_stepper_panel_in_jupyterlab(lab, tmp_path):
    PANEL_SHOTS.mkdir(parents=True, exist_ok=True)
    DAGVIEW_SHOTS.mkdir(parents=True, exist_ok=True)
    src = _panel_notebook(tmp_path / "panel.ipynb")
    with browser() as b:
        page, errors = _open_and_run_all(lab, b, "stepper_panel", src)
        _assert_no_error_outputs(page)
        # the kernel's own graph is the reference: the DAG must draw every one of its nodes
        want_nodes = int(page.locator(".jp-OutputArea-output", has_text=re.compile(r"^\d+$"))
                         .first.text_content())
        assert want_nodes > 200
        states = _assert_dags_drawn(page, want_nodes)
        cards = page.eval_on_selector_all(
            ".jl-stepper", "els => els.map(s => (s.querySelector('.jl-current .jl-head') || "
            "{textContent: null}).textContent)")
        first = _kernel_json(page, "FIRST_PARAM_JSON=")  # the model's own first parameter
        assert len(cards) == N_PANELS and all(c and c.startswith(f"next: placeholder {first}")
                                              for c in cards), (cards, first)
        panel = page.locator(".jl-stepper", has=page.locator(".jl-current")).first
        panel.scroll_into_view_if_needed()
        page.screenshot(path=str(PANEL_SHOTS / "after_opened.png"))
        # the readable current node, and the ring on it
        card = panel.locator(".jl-current")
        assert "%" not in card.text_content() and "num_users" not in card.text_content()
        assert states[0]["ringed"] == _current_name(panel) == "arg0_1"
        assert panel.locator(".jl-current .jl-head code").first.text_content() == first
        step = panel.get_by_role("button", name="Step", exact=True)
        for _ in range(31):  # past the 30 parameters and inputs, onto a forward node
            step.click()
        label = panel.locator(".widget-label", has_text=re.compile(r"^position 31 /"))
        label.wait_for(timeout=60_000)
        assert "forward" in card.text_content() and "output" in card.text_content()
        ringed = page.eval_on_selector_all(".jl-stepper .jl-dag", DAG_STATE)[0]["ringed"]
        assert ringed == _current_name(panel) != "arg0_1"
        # one more step runs the embedding: its detail panel shows the value's statistics
        step.click()
        panel.locator(".widget-label", has_text=re.compile(r"^position 32 /")).wait_for(
            timeout=60_000)
        dag = panel.locator(".jl-dag").first
        dag.scroll_into_view_if_needed()
        xy = dag.evaluate("""d => { const v = d.jlView, i = v.index.get('embedding');
            const r = v.canvas.getBoundingClientRect(); v.vx = v.x[i] - r.width / 2 / v.k;
            v.vy = v.y[i] + r.height / 2 / (v.k * v.ay); v.render();
            const [sx, sy] = v.toScreen(v.x[i], v.y[i]); return [r.left + sx, r.top + sy]; }""")
        page.mouse.click(*xy)
        detail = dag.locator(".jl-detail")
        assert detail.locator(".jl-detail-name").text_content() == "embedding"
        detail.locator("td.jl-value").first.wait_for(timeout=30_000)
        rows = dict(dag.evaluate("d => [...d.querySelectorAll('.jl-detail td.jl-value')]"
                                 ".map(td => [td.previousSibling.textContent, td.textContent])"))
        ref = _kernel_json(page, "EMB_JSON=")
        assert rows["value"] == f"({', '.join(map(str, ref['shape']))}) float32", rows
        for k in ("mean", "std", "min", "max", "norm"):
            assert float(rows[k]) == pytest.approx(ref[k], rel=5e-4), (k, rows[k], ref[k])
        assert rows["NaN / Inf"] == f"{ref['nan']} / {ref['inf']}"
        page.screenshot(path=str(DAGVIEW_SHOTS / "stepper_detail_stats.png"))
        # breakpoints as chips, removed one by one; a name that matches nothing is refused
        text = panel.locator("input[placeholder='node name / module prefix / op']")
        kind = panel.locator("select").first
        add = panel.get_by_role("button", name="Add breakpoint")
        for k, t in (("module", "h.1.attn"), ("op", "gelu_backward"), ("op", "not_an_op")):
            kind.select_option(k)
            text.fill(t)
            text.press("Tab")  # sync the text before the click
            add.click()
        msg = panel.locator(".jl-sp.jl-bad", has_text="would never stop")
        msg.wait_for(timeout=60_000)
        chips = panel.locator("button.jl-chip")
        assert chips.all_text_contents() == ["module h.1.attn  ✕", "op gelu_backward  ✕"]
        page.screenshot(path=str(PANEL_SHOTS / "after_chips.png"))
        chips.first.click()
        page.wait_for_function("el => el.querySelectorAll('button.jl-chip').length === 1",
                               arg=panel.element_handle(), timeout=60_000)
        assert chips.all_text_contents() == ["op gelu_backward  ✕"]
        panel.get_by_role("button", name="Continue").click()
        panel.locator(".jl-sp", has_text="by breakpoint op gelu_backward").wait_for(
            timeout=60_000)
        # the card is a separate widget: wait for its update rather than race it
        card.locator(".jl-op", has_text="gelu_backward").wait_for(timeout=60_000)
        assert card.locator(".jl-op").text_content() == "gelu_backward"
        assert "forward twin" in card.text_content()
        # the comparison, styled, and cleared by Reset
        panel.get_by_role("button", name="Compare with eager").click()
        result = panel.locator(".jl-compare")
        result.wait_for(timeout=120_000)
        assert "bit-exact" in result.text_content()
        panel.evaluate("el => el.scrollIntoView({block: 'start'})")
        page.screenshot(path=str(PANEL_SHOTS / "after_compare.png"))
        panel.get_by_role("button", name="Reset").click()
        result.wait_for(state="detached", timeout=60_000)
        assert _current_name(panel) == "arg0_1"
        # the panel appears quickly, and again and again without a blank DAG
        seconds = [_panel_timing(page) for _ in range(2)]
        print(f"\n[browser] stepper panel: cell run to DAG drawn {seconds} s")
        _assert_dags_drawn(page, want_nodes)
    assert errors.errors == [], errors.errors
