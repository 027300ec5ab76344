"""ipywidgets 7's own front end in a real browser: classic Notebook 6.5.7 with
widgetsnbextension 3.6.10 (Colab's published versions), served from a host venv.

:func:`drive_widgets` opens :data:`tests.hostsim.WIDGET_CELLS`' first cells (the
setup, ``jl.explore``, the stepper panel) plus a cell printing the references
the browser's view is checked against, runs them, and then acts as a user does
in the page: it types a search into explore's box, hides the backward phase and
clicks Step. It returns what the page showed; the caller asserts.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import secrets
import signal
import subprocess
import time
import urllib.request
from typing import Any

from tests import hostsim
from tests.chromium import PageErrors, browser, code_notebook

# the graph's own answers, printed by the kernel, that the page must agree with
REFERENCE_CELL = """\
import json
from jointlab import meta
print("JL-REF " + json.dumps({
    "addmm": [n.name for n in joint.graph.nodes if n.target is torch.ops.aten.addmm.default],
    "nodes": len(joint.graph.nodes),
    "not_backward": sum(1 for n in joint.graph.nodes
                        if meta.info(n).get("phase") != "backward")}))"""
READY = "() => document.querySelector('{sel}')?.dataset.ready"
VISIBLE = "() => document.querySelector('.jl-explore-dag').jlView.visNodes.length"
# what a failure report needs: the search box's value, explore's status line (the kernel
# wrote it: it says whether the search reached the kernel), table rows, the stepper label,
# how many child views explore's box holds (5 when its status line and table are there)
STATE = """() => ({
  search: [...document.querySelectorAll('input[placeholder^="search op"]')].map(i => i.value),
  status: [...document.querySelectorAll('.widget-html-content')]
            .map(h => h.textContent).filter(t => t.includes('selected')),
  table_rows: document.querySelectorAll('.jl-frame tbody tr').length,
  labels: [...document.querySelectorAll('.widget-label')].map(l => l.textContent)
            .filter(t => t.startsWith('position')),
  busy: document.querySelector('#kernel_indicator_icon')?.className ?? null,
  explore_children: document.querySelector('.jl-explore-dag')?.closest('.widget-vbox')
            ?.children.length ?? null,
})"""


def _notebook(path: pathlib.Path) -> pathlib.Path:
    return code_notebook(path, [*hostsim.WIDGET_CELLS[:3], REFERENCE_CELL])


def _serve(python: pathlib.Path, root: pathlib.Path, port: int, token: str) -> subprocess.Popen:
    cfg = root / ".cfg"
    (cfg / "nbconfig").mkdir(parents=True)
    # plotly's nbextension fetches from a CDN this sandbox cannot reach; jointlab needs none
    (cfg / "nbconfig" / "notebook.json").write_text(
        json.dumps({"load_extensions": {"jupyterlab-plotly/extension": False}}))
    env = {**hostsim._env(python), "JUPYTER_CONFIG_DIR": str(cfg),
           "JUPYTER_RUNTIME_DIR": str(root / ".rt"), "IPYTHONDIR": str(root / ".ipython")}
    cmd = [str(python), "-m", "notebook", "--no-browser", "--allow-root", f"--port={port}",
           "--ip=127.0.0.1", f"--NotebookApp.token={token}", f"--notebook-dir={root}",
           "--NotebookApp.port_retries=0"]
    log = open(root / "server.log", "w")  # noqa: SIM115 (closed with the server)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root,
                            start_new_session=True)


def _wait_up(proc: subprocess.Popen, base: str, token: str, log: pathlib.Path) -> None:
    t0 = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() - t0 > 180:
            raise AssertionError(f"classic notebook server did not start:\n{log.read_text()}")
        time.sleep(0.5)


# a shell round trip: the kernel answers in order, so once this reply is in, so is the
# reply to the widget manager's own earlier comm_info request
COMM_INFO = """() => new Promise(done => Jupyter.notebook.kernel.send_shell_message(
  'comm_info_request', {target_name: 'jupyter.widget'},
  {shell: {reply: () => setTimeout(done, 300)}}))"""


def _run_all(page: Any, fallback: list[str]) -> None:
    """Run every cell once the page is ready for widgets, as a user does.

    Ready means the kernel is connected, ipywidgets' extension registered its comm
    target, and its widget manager finished loading the kernel's widgets: widgetsnbextension
    3.6 asks the kernel (a control comm, then, with ipywidgets 7's kernel, ``comm_info``)
    and afterwards renders again every cell output holding a widget. Widgets displayed
    before that second render lose their views (their outputs' ``model_id`` set to ``""``,
    hidden): explore and the panel never showed in 1 of 4 runs of this test.
    """
    page.wait_for_function("() => window.Jupyter?.notebook?.kernel?.is_connected() && "
                           "!!Jupyter.notebook.kernel.comm_manager.targets['jupyter.widget']",
                           timeout=120_000)
    t0 = time.monotonic()  # the control comm is refused by ipywidgets 7's kernel, logged
    while not fallback and time.monotonic() - t0 < 60:
        page.wait_for_timeout(200)
    page.evaluate(COMM_INFO)
    page.evaluate("() => Jupyter.notebook.execute_all_cells()")
    # the last cell's printed reference: every cell has run and its output arrived
    page.wait_for_function("() => [...document.querySelectorAll('.output_subarea')]"
                           ".some(o => o.textContent.includes('JL-REF '))",
                           timeout=300_000, polling=500)


def _search(box: Any, text: str) -> None:
    """Type ``text`` and Enter in explore's search box, as a user does."""
    box.fill(text)
    box.press("Enter")


def _act(page: Any, shots: pathlib.Path) -> dict:
    """Search, hide the backward phase and Step, as a user does; what the page shows."""
    out: dict[str, Any] = {}
    for sel in (".jl-explore-dag", ".jl-stepper-dag"):
        page.wait_for_function(READY.format(sel=sel), timeout=120_000)
    text = "".join(page.locator(".output_subarea").all_text_contents())
    out["ref"] = json.loads(text.split("JL-REF ", 1)[1].splitlines()[0])
    out["visible_all"] = page.evaluate(VISIBLE)
    _search(page.get_by_placeholder("search op or module"), "addmm")  # explore's box
    page.wait_for_function("() => document.querySelectorAll('.jl-frame tbody tr').length",
                           timeout=60_000)
    out["table_rows"] = page.evaluate(
        "() => [...document.querySelectorAll('.jl-frame tbody tr th')].map(t => t.textContent)")
    page.locator(".jl-frame").first.scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "widgets7_explore_search.png"))
    page.locator("button", has_text=re.compile(r"^backward$")).first.click()
    page.wait_for_function(f"() => ({VISIBLE})() < {out['visible_all']}", timeout=30_000)
    out["visible_forward"] = page.evaluate(VISIBLE)
    label = page.locator(".widget-label", has_text=re.compile(r"^position \d+ / \d+$")).first
    out["position_before"] = label.text_content(timeout=120_000)
    for _ in range(3):
        page.locator("button", has_text=re.compile(r"^Step$")).first.click()
    page.wait_for_function("l => /^position 3 /.test(l.textContent)",
                           arg=label.element_handle(), timeout=30_000)
    out["position_after"] = label.text_content()
    label.scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "widgets7_stepper.png"))
    return out


def drive_widgets(python: pathlib.Path, root: pathlib.Path, port: int) -> dict:
    """Serve classic Notebook from ``python``'s venv; run and use the widget notebook.

    Args:
        python: A venv's Python with notebook 6, widgetsnbextension 3, ipywidgets 7 and
            jointlab installed.
        root: An empty folder for the notebook, the server's config and its log.
        port: A free local port.

    Returns:
        ``ref`` (the kernel's own answers), ``table_rows``, ``visible_all``,
        ``visible_forward``, ``position_before``/``after``, ``errors`` (page and
        console errors) and ``shots`` (the screenshots' folder).
    """
    shots = root / "shots"
    shots.mkdir(parents=True)
    _notebook(root / "widgets.ipynb")
    token, base = secrets.token_hex(16), f"http://127.0.0.1:{port}"
    proc = _serve(python, root, port, token)
    try:
        _wait_up(proc, base, token, root / "server.log")
        with browser() as b:
            page = b.new_page(viewport={"width": 1300, "height": 1100})
            errors, fallback = PageErrors(page), []
            page.on("console", lambda m: "jupyter.widget.control" in m.text
                    and fallback.append(m.text))
            page.goto(f"{base}/notebooks/widgets.ipynb?token={token}")
            try:
                _run_all(page, fallback)
                out = _act(page, shots)
            except Exception as exc:  # what the page showed when it stopped
                page.screenshot(path=str(shots / "failed.png"), full_page=True)
                # the notebook scrolls inside its own box: show the stepper panel too
                with contextlib.suppress(Exception):  # never hide the failure above
                    page.evaluate("() => document.querySelector('.jl-stepper-dag')"
                                  "?.closest('.output_area')?.scrollIntoView()")
                    page.screenshot(path=str(shots / "failed_panel.png"))
                state = "unknown"
                with contextlib.suppress(Exception):
                    state = page.evaluate(STATE)
                raise AssertionError(f"{exc}\npage state: {state}\npage errors: {errors.errors}\n"
                                     f"screenshot: {shots / 'failed.png'}") from exc
            out["errors"] = list(errors.errors)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    return {**out, "shots": str(shots)}
