"""Headless Chromium for the browser tests (system Chromium driven by Playwright).

``pytest.skip`` only when no Chromium binary is installed; CI installs it
(``.ci/run``). Screenshots go to a temp dir and, when ``JOINTLAB_SCREENSHOTS``
is set, are copied there as well.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]
# Console noise that is not a page error: refused network requests in a closed sandbox.
BENIGN = ("net::ERR_CONNECTION_REFUSED", "net::ERR_INTERNET_DISCONNECTED", "net::ERR_FAILED",
          "net::ERR_NAME_NOT_RESOLVED", "net::ERR_BLOCKED_BY_CLIENT", "Failed to load resource")


def chromium_path() -> str:
    """Path of the system Chromium, or skip the test with the reason."""
    for cand in (os.environ.get("JOINTLAB_CHROMIUM"), "/usr/bin/chromium",
                 shutil.which("chromium"), shutil.which("chromium-browser")):
        if cand and pathlib.Path(cand).exists():
            return cand
    pytest.skip("Chromium is not installed (apt-get install chromium; .ci/run does this in CI)")


@contextmanager
def browser() -> Iterator[Any]:
    """A headless Chromium browser (Playwright) for the duration of the block."""
    from playwright.sync_api import sync_playwright

    exe = chromium_path()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


class PageErrors:
    """Collects uncaught page errors and console errors (benign network refusals ignored)."""

    def __init__(self, page: Any) -> None:
        """Start listening on ``page``."""
        self.errors: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("console", self._console)

    def _console(self, msg: Any) -> None:
        if msg.type != "error":
            return
        text = msg.text
        if any(b in text for b in BENIGN):
            return
        self.errors.append(f"console.error: {text}")


#: True once a ``dag_view`` page's view is mounted and has drawn its first frame.
DAG_DRAWN = ("() => { const d = document.querySelector('.jl-dag');"
             " return d && d.jlView && d.jlView.lastFrameMs !== undefined }")


def open_dag_page(b: Any, path: pathlib.Path, *, init: str | None = None, width: int = 1400,
                  height: int = 760, drawn: str = DAG_DRAWN,
                  timeout: int = 60_000) -> tuple[Any, PageErrors]:
    """Open the written HTML at ``path`` in a new page and wait until ``drawn`` holds.

    Args:
        b: The browser (:func:`browser`).
        path: The HTML file.
        init: A script run in the page before its own scripts.
        width: Viewport width.
        height: Viewport height.
        drawn: The JS predicate to wait for (default: the DAG drew its first frame).
        timeout: Milliseconds to wait.

    Returns:
        The page and its error collector.
    """
    page = b.new_page(viewport={"width": width, "height": height})
    if init:
        page.add_init_script(init)
    errors = PageErrors(page)
    page.goto(path.as_uri())
    page.wait_for_function(drawn, timeout=timeout)
    return page, errors


def code_notebook(path: pathlib.Path, sources: list[str]) -> pathlib.Path:
    """Write ``sources`` as the code cells of a Python 3 notebook (nbformat 4.5) at ``path``.

    Args:
        path: Where to write the ``.ipynb``.
        sources: Each cell's source, in order (cell ids ``c0``, ``c1``...).

    Returns:
        ``path``.
    """
    cells = [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None,
              "outputs": [], "source": src} for i, src in enumerate(sources)]
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3",
                             "language": "python"}}
    path.write_text(json.dumps({"cells": cells, "metadata": kernel, "nbformat": 4,
                                "nbformat_minor": 5}))
    return path


def save_screenshot(page: Any, tmp_dir: pathlib.Path, name: str) -> pathlib.Path:
    """Full-page screenshot into ``tmp_dir`` (and ``$JOINTLAB_SCREENSHOTS`` when set)."""
    path = tmp_dir / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    dest = os.environ.get("JOINTLAB_SCREENSHOTS")
    if dest:
        pathlib.Path(dest).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, pathlib.Path(dest) / path.name)
    return path


# -- the bundled DAG view (jointlab/viz/static/dag_*.js) on a page ----------------------
def dag_state(page: Any) -> dict[str, Any]:
    """The first ``.jl-dag`` view's ``state()``, read after the next animation frame."""
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")
    return page.evaluate("() => document.querySelector('.jl-dag').jlView.state()")


def dag_screen_of(page: Any, js_world: str) -> list[float]:
    """Page coordinates of a world point given as JS over ``v`` (the view)."""
    return page.evaluate(f"""() => {{ const v = document.querySelector('.jl-dag').jlView;
        const r = v.canvas.getBoundingClientRect(); const [x, y] = {js_world};
        const [sx, sy] = v.toScreen(x, y); return [r.left + sx, r.top + sy]; }}""")


def dag_layout(page: Any) -> dict[str, Any]:
    """The first ``.jl-dag`` view's laid-out items, edges and open groups, from its own state.

    ``items``: per visible item its ``id`` (node name, or ``group#f`` / ``group#b`` for a
    closed group's box), ``band``, ``layer`` and world ``rect``; ``edges``: flat item-index
    pairs; ``expanded``: per group, open or not.
    """
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")
    return page.evaluate("""() => { const v = document.querySelector('.jl-dag').jlView;
        return {...v.layoutState(), expanded: Array.from(v.expanded)}; }""")
