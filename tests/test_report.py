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
from tests.chromium import PageErrors, browser, save_screenshot

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
    assert page.count("Plotly.newPlot") >= 2  # the DAG and the memory plot


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
        assert page.locator("div.js-plotly-plot .main-svg").count() >= 2
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
