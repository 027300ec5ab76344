"""The HTML report: self-contained, escapes hostile names, renders offline from file://.

Also runs ``python -m jointlab demo`` as a user would and opens the report it
writes in headless Chromium with the network off.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from tests.chromium import PageErrors, browser, dag_screen_of, dag_state, save_screenshot

EVIL = "</script><script>alert(1)</script>"
REMOTE = re.compile(r"""<(script|link|img|iframe)\b[^>]*\b(src|href)\s*=\s*["']?\s*(https?:)?//""",
                    re.IGNORECASE)


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("demo") / "sub" / "demo.html"
    proc = subprocess.run([sys.executable, "-m", "jointlab", "demo", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"report written to {out}" in proc.stdout
    assert "matches eager" in proc.stdout
    assert out.is_file()
    return out


def _evil_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("inp", nn.Linear(4, 8))
    model.add_module(EVIL, nn.Tanh())
    model.add_module("out", nn.Linear(8, 2))
    return model


@pytest.fixture(scope="module")
def evil_report(tmp_path_factory) -> pathlib.Path:
    model = _evil_model()
    inputs = {"x": torch.randn(3, 4), "y": torch.randn(3, 2)}

    def train_fn(m, x, y):
        return F.mse_loss(m(x), y)

    joint = jl.trace(model, train_fn, inputs)
    assert EVIL in set(joint.nodes["module"])  # the hostile name reached the data
    return jl.report(joint, tmp_path_factory.mktemp("evil") / "evil.html", model=model,
                     inputs=inputs)


def test_demo_report_is_self_contained(demo_report):
    page = demo_report.read_text(encoding="utf-8")
    assert REMOTE.search(page) is None, REMOTE.search(page).group(0)
    assert "<script src" not in page.lower()
    assert page.count("Plotly.newPlot") >= 1  # the memory plot
    assert page.count('class="jl-dag"') == 1 and "window.jointlabDag(" in page  # the DAG view


def test_hostile_module_name_is_escaped(evil_report):
    page = evil_report.read_text(encoding="utf-8")
    assert EVIL not in page
    assert "<script>alert(1)" not in page
    assert REMOTE.search(page) is None


def _open_offline(b, path: pathlib.Path):
    context = b.new_context(offline=True, viewport={"width": 1400, "height": 900})
    requested: list[str] = []

    def block(route):
        requested.append(route.request.url)
        route.abort()

    context.route(re.compile(r"^(?!file:).*"), block)
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    errors = PageErrors(page)
    page.goto(path.as_uri())
    return context, page, errors, dialogs, requested


@pytest.mark.browser
def test_demo_report_renders_offline(demo_report, tmp_path):
    with browser() as b:
        context, page, errors, dialogs, requested = _open_offline(b, demo_report)
        page.wait_for_selector("div.js-plotly-plot .main-svg", timeout=60_000)
        assert page.locator("div.js-plotly-plot .main-svg").count() >= 1  # the memory plot
        page.wait_for_function("() => document.querySelector('.jl-dag')?.jlView?.lastFrameMs"
                               " !== undefined", timeout=60_000)  # the DAG drew a frame
        rows = page.locator("#jl-nodes tbody tr")
        assert rows.count() > 10
        assert "nodes" in page.locator("#jl-count").inner_text()
        page.fill("#jl-filter", "aten.mm")  # the filter narrows the table
        page.wait_for_function("document.querySelectorAll('#jl-nodes tbody tr').length > 0")
        cells = page.locator("#jl-nodes tbody tr td:nth-child(4)").all_inner_texts()
        assert cells and all("aten.mm" in c for c in cells)
        save_screenshot(page, tmp_path, "report_demo")
        context.close()
    assert errors.errors == [] and dialogs == []
    assert requested == []  # nothing tried to leave file://


@pytest.mark.browser
def test_hostile_name_is_shown_as_text_and_never_runs(evil_report, tmp_path):
    with browser() as b:
        context, page, errors, dialogs, _ = _open_offline(b, evil_report)
        page.wait_for_selector("div.js-plotly-plot .main-svg", timeout=60_000)
        page.wait_for_timeout(500)
        cells = page.locator("#jl-nodes tbody td").all_inner_texts()
        assert EVIL in cells  # displayed verbatim as text in the node table
        injected = page.evaluate(
            "[...document.scripts].filter(s => s.textContent.trim() === 'alert(1)').length")
        assert injected == 0  # the name never became a <script> element
        save_screenshot(page, tmp_path, "report_hostile_name")
        context.close()
    assert dialogs == [], dialogs
    assert errors.errors == []


def test_report_header_names_model_mode_versions_and_each_section(evil_report):
    from importlib.metadata import version

    page = evil_report.read_text(encoding="utf-8")
    header = re.search(r"<div class='jl-header'>(.*?)</div>", page).group(1)
    n_params = sum(p.numel() for p in _evil_model().parameters())
    for text in ("model <b>Sequential</b>", f"parameters <b>{n_params:,}</b>",
                 "mode <b>make_fx</b>", f"torch <b>{torch.__version__}</b>",
                 f"jointlab <b>{version('jointlab')}</b>",
                 f"date <b>{__import__('datetime').date.today():%Y-%m-%d}"):
        assert text in header, (text, header)
    titles = re.findall(r"<h2>(.*?)</h2>\n<p class='jl-lede'>(.*?)</p>", page)
    assert [t for t, _ in titles] == ["Summary", "Nodes", "Forward/backward DAG", "Memory",
                                      "Comparison with eager"]
    assert all(len(lede) > 20 for _, lede in titles)


def _broken_gradient_joint():
    """A traced model whose graph emits 1.5 x the gradient of ``out.weight``."""
    model = _evil_model()
    inputs = {"x": torch.randn(3, 4), "y": torch.randn(3, 2)}
    joint = jl.trace(model, lambda m, x, y: F.mse_loss(m(x), y), inputs)
    graph = joint.graph
    grad = next(n for n in graph.nodes if n.meta["jointlab"].get("grad_of") == "out.weight")
    with graph.inserting_after(grad):
        wrong = graph.call_function(torch.ops.aten.mul.Tensor, (grad, 1.5))
    wrong.meta.update(grad.meta)
    graph.output_node().replace_input_with(grad, wrong)
    joint.recompute()
    return joint, model, inputs


def test_comparison_section_puts_the_verdict_and_worst_tensor_first():
    from jointlab.viz.comparison import comparison_html, worst_first

    joint, model, inputs = _broken_gradient_joint()
    cmp = jl.compare(joint, model, inputs)
    assert cmp.verdict == "MISMATCH"
    rows = worst_first(cmp)
    assert len(rows) == len(cmp.loss) + len(cmp.grads) + len(cmp.loss_dict) + len(cmp.buffers)
    assert rows.iloc[0]["name"] == "out.weight" and not rows.iloc[0]["ok"]
    assert rows["ok"].iloc[1:].all()
    page = comparison_html(cmp)
    assert page.index("jl-badge bad'>MISMATCH") < page.index("<table>")
    first_row = re.search(r"<tbody><tr class='jl-fail'><td>gradient</td><td>(.*?)</td>", page)
    assert first_row and first_row.group(1) == "out.weight"
    assert "1 beyond tolerance" in page


def _names_on_every_page(page) -> list[str]:
    names: list[str] = []
    while True:
        names += page.locator("#jl-nodes tbody tr td:nth-child(1)").all_inner_texts()
        where = page.locator("#jl-page").inner_text()
        current, total = map(int, re.fullmatch(r"page (\d+) of (\d+)", where).groups())
        if current == total:
            return names
        page.click("#jl-next")


@pytest.mark.browser
def test_demo_report_every_row_reachable_compute_first_sorted_with_units(demo_report, tmp_path):
    with browser() as b:
        context, page, errors, _, _ = _open_offline(b, demo_report)
        page.wait_for_selector("#jl-nodes tbody tr")
        data = page.evaluate("JSON.parse(document.getElementById('jl-node-data').textContent)")
        phase = data["columns"].index("phase") + 1
        compute = [r[0] for r in data["rows"] if r[phase] in ("forward", "backward")]
        assert "model <b>GPT</b>" in page.inner_html(".jl-header")
        # opens on the compute nodes, every one reachable through the pager
        assert _names_on_every_page(page) == compute
        page.check("#jl-all")
        assert _names_on_every_page(page) == [r[0] for r in data["rows"]]
        assert len(data["rows"]) > 200
        # sizes in human units, the exact value on hover
        col = data["columns"].index("bytes") + 2
        cell = page.locator(f"#jl-nodes tbody tr td:nth-child({col})").first
        first = page.locator("#jl-nodes tbody tr td:nth-child(1)").first.inner_text()
        exact = next(r[col - 1] for r in data["rows"] if r[0] == first)
        assert cell.get_attribute("title") == f"{exact:,} bytes"
        # the sort indicator follows the clicked header, largest first on the second click
        th = page.locator(f"#jl-nodes thead th:nth-child({col})")
        th.click()
        assert th.get_attribute("aria-sort") == "ascending"
        th.click()
        assert th.get_attribute("aria-sort") == "descending"
        top = page.locator(f"#jl-nodes tbody tr td:nth-child({col})").first.get_attribute("title")
        assert top == f"{max(r[col - 1] for r in data['rows']):,} bytes"
        assert "KiB" in page.locator(f"#jl-nodes tbody tr td:nth-child({col})").first.inner_text()
        # the source column is fully visible inside the table's box
        src = page.locator("#jl-nodes tbody tr td:last-child").first.bounding_box()
        box = page.locator(".jl-scroll").bounding_box()
        assert src["x"] + src["width"] <= box["x"] + box["width"] + 1
        save_screenshot(page, tmp_path, "report_table")
        context.close()
    assert errors.errors == []


# -- the navigable DAG in the report, and the root module's own ops ------------------------
def _dag_shot(page, name: str) -> None:
    """A picture of the report's DAG section, for a person to look at."""
    import os

    shots = pathlib.Path(os.environ.get("JOINTLAB_DAGVIEW_SHOTS", "/tmp/dagviews_shots"))
    shots.mkdir(parents=True, exist_ok=True)
    page.locator(".jl-dag").screenshot(path=str(shots / f"{name}.png"))


class _Scaled(nn.Module):
    """A root module with an op of its own (``* 2``) around a child Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x) * 2.0


@pytest.fixture(scope="module")
def lm_report(tmp_path_factory):
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2

    model = make_gpt2(n_layer=2, d=32, n_head=4, vocab=64, seq=8)
    inputs = lm_inputs(2, 64, 8)
    joint = jl.trace(model, lm_train_fn, inputs)
    return joint, jl.report(joint, tmp_path_factory.mktemp("lm") / "lm.html")


@pytest.mark.browser
def test_report_dag_labels_expand_search_and_twin(lm_report, tmp_path):
    joint, path = lm_report
    nodes = list(joint.graph.nodes)
    with browser() as b:
        context, page, errors, dialogs, requested = _open_offline(b, path)
        page.wait_for_function("() => document.querySelector('.jl-dag')?.jlView?.lastFrameMs"
                               " !== undefined", timeout=60_000)
        page.locator(".jl-dag").scroll_into_view_if_needed()
        s = dag_state(page)
        assert s["visibleNodes"] == len(nodes)  # the whole graph fits the default budget
        params = {jl.meta.info(n)["fqn"] for n in nodes if jl.meta.phase(n) == "param"}
        assert s["labelCount"] > 20 and set(s["labels"]) & params, s["labels"]
        # collapse, then open the first block by clicking its forward box
        page.locator(".jl-dag").get_by_role("button", name="collapse all").click()
        closed = dag_state(page)
        assert closed["visibleNodes"] < len(nodes) and closed["visibleBoxes"] >= 2
        block = "h.0"
        for name in ("h", "h.0"):  # h holds only the blocks; h.0 has nodes of its own
            page.mouse.click(*dag_screen_of(page, f"""(() => {{
                const g = v.P.groups.name.indexOf({name!r}), r = v.boxRect(g * 2);
                return [(r[0] + r[2]) / 2, (r[1] + r[3]) / 2]; }})()"""))
        after = dag_state(page)
        own = sum(jl.meta.module(n) == block for n in nodes)  # the block's own nodes
        shown = page.evaluate(f"""() => {{ const v = document.querySelector('.jl-dag').jlView;
            return v.visNodes.filter(i => v.P.groups.name[v.g[i]] === {block!r}).length; }}""")
        assert own > 0 and shown == own
        assert after["visibleNodes"] > closed["visibleNodes"]
        _dag_shot(page, "report_dag_expanded")
        # search an op: every match highlighted; each in turn (Enter steps) inside the canvas
        want = [n.name for n in nodes if jl.meta.op_name(n) == "gelu_backward"]
        page.fill(".jl-dag .jl-search", "gelu_backward")
        page.press(".jl-dag .jl-search", "Enter")
        assert dag_state(page)["hits"] == len(want) >= 1
        inside = []
        for k, name in enumerate(want):
            if k:
                page.press(".jl-dag .jl-search", "Enter")
                dag_state(page)
            inside.append(page.evaluate(f"""() => {{
                const v = document.querySelector('.jl-dag').jlView, c = v.canvas;
                const i = v.P.nodes.name.indexOf({name!r}), [sx, sy] = v.toScreen(v.x[i], v.y[i]);
                return v.itemOf[i] === i && v.hits.has(i) && sx >= 0 && sy >= 0
                    && sx <= c.clientWidth && sy <= c.clientHeight; }}"""))
        assert all(inside), inside
        page.press(".jl-dag .jl-search", "Enter")  # back to the first match
        dag_state(page)
        # the detail panel of a gelu_backward names its forward twin
        node = next(n for n in nodes if n.name == want[0])
        twin = jl.meta.info(node)["fwd_twin"]
        page.mouse.click(*dag_screen_of(page, f"(() => {{ const i = v.P.nodes.name.indexOf("
                                            f"{node.name!r}); return [v.x[i], v.y[i]]; }})()"))
        panel = page.locator(".jl-dag .jl-detail")
        assert panel.locator(".jl-detail-name").text_content() == node.name
        assert panel.locator(".jl-twin .jl-link").first.text_content() == twin
        _dag_shot(page, "report_dag_detail")
        context.close()
    assert errors.errors == [] and dialogs == [] and requested == []


@pytest.mark.browser
def test_report_table_names_the_root_modules_own_ops(tmp_path):
    model = _Scaled()
    inputs = {"x": torch.randn(5, 4), "y": torch.randn(5, 3)}
    joint = jl.trace(model, lambda m, x, y: F.mse_loss(m(x), y), inputs)
    df = joint.nodes
    assert (df.loc[df["target"] == "aten.mul", "module"] == "").any()  # data keeps ""
    path = jl.report(joint, tmp_path / "root.html")
    with browser() as b:
        context, page, errors, _, _ = _open_offline(b, path)
        page.wait_for_selector("#jl-nodes tbody tr")
        col = page.locator("#jl-nodes thead th").all_inner_texts().index("module") + 1
        cells = {}
        for row in page.locator("#jl-nodes tbody tr").all():
            tds = row.locator("td").all_inner_texts()
            cells[tds[0]] = (tds[col - 1], tds[3])  # module, target
        context.close()
    # the root's own ``* 2`` (forward, and its backward) is named; the loss in train_fn is not
    root = {k for k, (_, t) in cells.items() if t == "aten.mul"}
    assert root and all(cells[k][0] == "(root) _Scaled" for k in root), cells
    loss = {k for k, (_, t) in cells.items() if "mse_loss" in t}
    assert loss and not any(cells[k][0].startswith("(root)") for k in loss), cells
    assert all(cells[k][0] == "lin" for k, (_, t) in cells.items() if t == "aten.addmm"), cells
    assert errors.errors == []
