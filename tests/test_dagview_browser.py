"""The bundled DAG view (``jl.dag_view``) in headless Chromium, read from its own state.

What a user must be able to read is checked against the page: the labels drawn on the
canvas (text and screen rectangle, as the renderer placed them), the module colours, the
listeners the page holds (counted by wrapping the browser's own registration functions
before the view loads), and the diff view's detail panel in the DOM.
Screenshots go to ``$JOINTLAB_DAG_SHOTS`` (default ``/tmp/dag_shots``).
"""

from __future__ import annotations

import os
import pathlib

import pytest

from tests.chromium import PageErrors, browser, chromium_path

pytestmark = pytest.mark.browser
SHOTS = pathlib.Path(os.environ.get("JOINTLAB_DAG_SHOTS", "/tmp/dag_shots"))
VIEW = "document.querySelector('.jl-dag').jlView"

# Counts what the page's own scripts (not the test driver's) register on window/document,
# and their live ResizeObservers and MutationObservers, by wrapping the browser's functions
# before any script runs; a registration is the page's when its call stack holds the page URL.
COUNT_LISTENERS = (pathlib.Path(__file__).parent / "count_listeners.js").read_text()


def _open(b, path, init: str | None = None, width: int = 1400, height: int = 760):
    page = b.new_page(viewport={"width": width, "height": height})
    if init:
        page.add_init_script(init)
    errors = PageErrors(page)
    page.goto(path.as_uri())
    page.wait_for_function("() => { const d = document.querySelector('.jl-dag');"
                           " return d && d.jlView && d.jlView.lastFrameMs !== undefined }",
                           timeout=120_000)
    return page, errors


@pytest.fixture(scope="module")
def lm_joint():
    import jointlab as jl
    from tests.fixtures import zoo

    f = zoo.FIXTURES["tiny_lm"]
    return jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))


def test_listeners_are_released_when_the_view_leaves_the_document(lm_joint, tmp_path):
    from jointlab.viz.dagview import dag_view

    chromium_path()
    path = dag_view(lm_joint).write_html(tmp_path / "dag.html")
    with browser() as b:
        page, errors = _open(b, path, init=COUNT_LISTENERS)
        base = page.evaluate("() => ({...window.__jlLive})")
        assert base["resize"] >= 1 and base["mutation"] >= 1  # the view holds them while shown
        assert page.evaluate("() => window.jointlabDag.live()") == 1
        box = page.locator(".jl-canvas").bounding_box()
        page.mouse.move(box["x"] + 200, box["y"] + 200)
        page.mouse.down()
        page.mouse.move(box["x"] + 260, box["y"] + 230)
        during = page.evaluate("() => ({...window.__jlLive})")
        assert during["window"] > base["window"]  # a drag listens on the window ...
        page.mouse.up()
        live = "() => ({...window.__jlLive})"
        assert page.evaluate(live)["window"] == base["window"]  # ... until it ends
        page.evaluate(f"() => {{ window.__v = {VIEW}; "
                      "document.querySelector('.jl-dag').remove(); }")
        page.wait_for_function("() => !window.__jlLive.resize && !window.__jlLive.mutation",
                               timeout=5_000)
        after = page.evaluate("() => ({...window.__jlLive, views: window.jointlabDag.live(),"
                              " raf: window.__v._raf || 0, released: window.__v.released})")
        assert after["window"] == base["window"] == 0 and after["document"] == 0
        assert after["views"] == 0 and after["raf"] == 0 and after["released"] is True
    assert errors.errors == [], errors.errors
