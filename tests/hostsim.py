"""Simulated Colab and Binder hosts: fresh virtual environments that run the notebooks.

Neither host can be reached from CI, so this does what each would do, as far as
one machine allows:

* **Colab**: a venv with Colab's published stack (:data:`COLAB_HOST`: torch
  2.11.0, ipywidgets 7.7.1, plotly 5.24.1, ... on Python 3.13 where this machine
  has it), built once and cached (:func:`host_env`), then cloned with hard links
  for each run; the notebook's own setup cell runs, its git URL pointed at this
  checkout, with a stub ``google.colab`` imported first so the cell takes its
  Colab branch. :func:`pip_list` before and after shows what the install changed.
* **Binder** (repo2docker): a venv built from ``binder/requirements.txt`` (torch
  from local disk instead of the unreachable CPU index), then ``binder/postBuild``,
  then every notebook with ``BINDER_*`` set.

The module is imported by ``tests/test_hosts.py`` and also executed by each
venv's own Python (``python hostsim.py run ...``) to run a notebook there, so
its top level imports only the standard library.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
GIT_URL = "git+https://github.com/jointlab/jointlab"
TORCH_PIN = "torch==2.13.0"  # the CPU build on local disk (dev, CI, Binder)
# Colab's published package list (googlecolab/backend-info, pip-freeze.txt, August
# 2026 snapshot, "Upgrade to Python 3.13"): the packages the notebooks touch, at
# Colab's versions. torch 2.11.0 is Colab's +cpu build there; here the registry's
# CUDA-linked wheel of the same release, which runs on the CPU.
COLAB_PYTHON = "3.13"
COLAB_HOST = {
    "torch": "2.11.0", "numpy": "2.1.3", "pandas": "2.2.3", "plotly": "5.24.1",
    "ipywidgets": "7.7.1", "widgetsnbextension": "3.6.10", "jupyterlab_widgets": "3.0.16",
    "anywidget": "0.9.21", "ipykernel": "6.17.1", "notebook": "6.5.7",
}
# Also on Colab (nbclient/nbformat come with its nbconvert); they run the notebook here.
COLAB_RUNNER = ["nbclient", "nbformat"]
# The lighter stack of the always-on check: Colab's pins on this Python with the dev
# torch from local disk (no 2.6 GB download in `make test`).
COLAB_LIGHT = [TORCH_PIN] + [f"{k}=={v}" for k, v in COLAB_HOST.items() if k != "torch"]
# What jointlab[colab] may add to such a host: jointlab itself, nothing Colab has.
COLAB_EXTRA = "colab"
# Mimetypes Colab's output area renders (the widget view through its custom
# widget manager); a DAG or widget output must carry one of these.
COLAB_RENDERS = {"text/html", "application/vnd.jupyter.widget-view+json", "image/png",
                 "image/svg+xml", "image/jpeg", "text/markdown", "text/latex"}
CACHE = pathlib.Path(os.environ.get("JOINTLAB_HOSTSIM_CACHE",
                                    pathlib.Path.home() / ".cache" / "jointlab-hostsim"))
PIP_TIMEOUT_S = 900
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
STUB_COLAB = {
    "google/__init__.py": "",
    "google/colab/__init__.py": "from . import output as output\n",
    "google/colab/output.py": (
        "CALLS = []\n\n\ndef enable_custom_widget_manager():\n"
        "    CALLS.append('enable_custom_widget_manager')\n"),
}
PROBE = """\
import json, sys, importlib.metadata as md, torch, jointlab
print('JL-PROBE ' + json.dumps({
    'prefix': sys.prefix, 'torch': torch.__version__, 'torch_file': torch.__file__,
    'jointlab_file': jointlab.__file__, 'jointlab_dist': md.version('jointlab'),
    'colab_calls': getattr(sys.modules.get('google.colab.output'), 'CALLS', None)}))
"""
TORCH_STAMP = """\
import json, os, torch, importlib.metadata as md
st = os.stat(torch.__file__)
dist = md.distribution('torch')
print(json.dumps({'version': torch.__version__, 'file': torch.__file__, 'inode': st.st_ino,
                  'mtime_ns': st.st_mtime_ns, 'dist': str(dist._path)}))
"""


# A notebook that builds every jointlab widget in a real kernel and drives each as its
# browser does, through the widget's comm (a state "update", a button's "click"): run
# under Colab's ipywidgets 7.7.1 by the light check. Cell 0 is its setup (a tiny model).
WIDGET_CELLS = [
    """\
import json
import ipywidgets as W
import torch
import jointlab as jl
from IPython.utils.capture import capture_output
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
inputs = {"x": torch.randn(3, 8), "y": torch.randn(3, 4)}
def train_fn(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)
joint = jl.trace(model, train_fn, inputs)
stepper = jl.Stepper(joint, model, inputs, device="cpu", seed=0)""",
    "app = jl.explore(joint, height=300)\napp",
    "panel = stepper.widget(train_fn=train_fn)\npanel",
    """\
def send(w, data):  # what the browser's widget manager sends on a comm
    w.comm.handle_msg({"content": {"comm_id": w.comm.comm_id, "data": data}, "buffers": [],
                       "header": {}, "parent_header": {}, "metadata": {}})
def update(w, **state):
    send(w, {"method": "update", "state": state, "buffer_paths": []})
def tree(w, out):
    if isinstance(w, W.Widget) and w.model_id not in out:
        out[w.model_id] = w
        for sub in [*getattr(w, "children", ()), getattr(w, "layout", None),
                    getattr(w, "style", None)]:
            tree(sub, out)
    return out
def view(w):
    with capture_output() as cap:
        display(w)
    return cap.outputs[-1].data.get("application/vnd.jupyter.widget-view+json")
from ipywidgets.widgets.widget import _remove_buffers
def serialisable(w):
    json.dumps(_remove_buffers(w.get_state())[0])
    return True
ex = app.explorer
widgets = {**tree(app, {}), **tree(panel, {})}
report = {"ipywidgets": W.__version__,
          "views": {"explore": view(app), "stepper": view(panel)},
          "view_ids": {"explore": app.model_id, "stepper": panel.model_id},
          "modules": sorted({f"{w._model_module} {w._model_module_version}"
                             for w in widgets.values()}),
          "serialisable": all(serialisable(w) for w in widgets.values()),
          "dag_widgets": [type(w).__name__ for w in widgets.values() if hasattr(w, "payload")]}
update(ex.search, value="addmm")
report["search"] = {"chosen": ex.chosen, "status": ex.status.value}
node = next(n for n, m in ex.infos.items() if m.get("fwd_twin"))
update(ex.view, click={"name": node, "n": 1})
report["click"] = {"node": node, "twin": ex.infos[node]["fwd_twin"], "selected": ex.view.selected}
update(ex.phases["backward"], value=False)
report["hidden"] = ex.view.hidden
update(ex.depth, index=1)
report["depth"] = {"control": ex.depth.value, "view": ex.view.depth, "want": ex.depth.options[1][1]}
send(panel.buttons["step"], {"method": "custom", "content": {"event": "click"}})
send(panel.buttons["step"], {"method": "custom", "content": {"event": "click"}})
report["step"] = {"position": stepper.position, "label": panel.position_label.value,
                  "ring": panel.dag.current, "current": stepper.current.name}
print("JL-WIDGETS " + json.dumps(report))""",
]


def write_widget_notebook(path: pathlib.Path) -> pathlib.Path:
    """Write :data:`WIDGET_CELLS` as a notebook at ``path`` (nbformat 4, by hand)."""
    cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
              "source": src} for src in WIDGET_CELLS]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    return path


def make_venv(path: pathlib.Path) -> pathlib.Path:
    """Create a fresh venv at ``path`` (no system site-packages) and return its Python."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return path / "bin" / "python"


def pip(python: pathlib.Path, *args: str, cwd: pathlib.Path | None = None) -> float:
    """Run ``python -m pip install -q ARGS``; return its wall time in seconds."""
    t0 = time.perf_counter()
    subprocess.run([str(python), "-m", "pip", "install", "-q", *args], check=True,
                   cwd=cwd, timeout=PIP_TIMEOUT_S, env=_env(python))
    return time.perf_counter() - t0


def torch_stamp(python: pathlib.Path) -> dict:
    """Torch's version, file, inode and mtime in ``python``'s venv (a reinstall changes them)."""
    out = subprocess.run([str(python), "-c", TORCH_STAMP], check=True, capture_output=True,
                         text=True, env=_env(python), cwd=python.parent)
    return json.loads(out.stdout.strip().splitlines()[-1])


def setup_command(notebook: pathlib.Path) -> str:
    """The requirement the setup cell (first cell) of ``notebook`` installs (``JOINTLAB = ...``)."""
    cell = json.loads(notebook.read_text())["cells"][0]
    lines = [ln.strip() for ln in "".join(cell["source"]).splitlines()]
    specs = [ln for ln in lines if ln.startswith("JOINTLAB = ")]
    assert len(specs) == 1, f"{notebook.name}: expected one JOINTLAB = line, got {specs}"
    return specs[0].split("=", 1)[1].strip().strip('"')


def local_command(command: str, checkout: pathlib.Path = ROOT) -> str:
    """``command`` with the git URL replaced by ``checkout`` (a ``file://`` URL)."""
    assert command.count(GIT_URL) == 1, command
    return command.replace(GIT_URL, checkout.as_uri())


def find_python(version: str) -> tuple[pathlib.Path, str]:
    """An interpreter of ``version`` (this one, PATH, pyenv), else this one; and a note."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if here == version:
        return pathlib.Path(sys.executable), f"Python {version}"
    pattern = os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python{version}")
    found = shutil.which(f"python{version}")  # may be a pyenv shim set to another version
    for cand in sorted(glob.glob(pattern)) + ([found] if found else []):
        runs = subprocess.run([cand, "-c", "import sys, venv; print(sys.version)"],
                              capture_output=True, text=True)
        if runs.returncode == 0 and runs.stdout.startswith(version + "."):
            return pathlib.Path(cand), f"Python {runs.stdout.split()[0]}"
    return (pathlib.Path(sys.executable),
            f"Python {here}: no Python {version} on this machine (Colab has {version})")


def pip_list(python: pathlib.Path) -> dict[str, str]:
    """``{name: version}`` of every distribution ``python`` sees (pip list; names normalised)."""
    out = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], check=True,
                         capture_output=True, text=True, env=_env(python))
    return {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(out.stdout)}


def list_diff(before: dict[str, str], after: dict[str, str]) -> dict[str, list[str]]:
    """What changed between two :func:`pip_list` results: added, removed, changed."""
    return {"added": sorted(f"{k} {after[k]}" for k in after.keys() - before.keys()),
            "removed": sorted(f"{k} {before[k]}" for k in before.keys() - after.keys()),
            "changed": sorted(f"{k} {before[k]} -> {after[k]}"
                              for k in before.keys() & after.keys() if before[k] != after[k])}


def host_env(name: str, python: pathlib.Path, packages: list[str]) -> pathlib.Path:
    """A venv of ``python`` with ``packages``, built once under :data:`CACHE` and kept.

    Keyed by the interpreter's version and the package list; built in a temporary
    folder and renamed into place, so an interrupted build is never reused. Clone
    it with :func:`clone_env` for each run: the cached one is never installed into.
    """
    version = subprocess.run([str(python), "-c", "import sys; print(sys.version)"], check=True,
                             capture_output=True, text=True).stdout.strip()
    key = hashlib.sha256(json.dumps([version, packages]).encode()).hexdigest()[:12]
    final = CACHE / f"{name}-{key}"
    if (final / ".complete").exists():
        return final
    CACHE.mkdir(parents=True, exist_ok=True)
    build = CACHE / f".{name}-{key}-{os.getpid()}"
    shutil.rmtree(build, ignore_errors=True)
    subprocess.run([str(python), "-m", "venv", str(build)], check=True)
    env = {**_env(build / "bin" / "python"), "PIP_CONSTRAINT": "/dev/null"}
    done = subprocess.run([str(build / "bin" / "python"), "-m", "pip", "install", "-q",
                           *packages], env=env, timeout=3 * PIP_TIMEOUT_S, capture_output=True,
                          text=True)
    assert done.returncode == 0, f"building the {name} host failed:\n{done.stderr[-4000:]}"
    (build / ".complete").write_text(json.dumps({"python": version, "packages": packages}))
    if (final / ".complete").exists():  # another run built it meanwhile: keep that one
        shutil.rmtree(build, ignore_errors=True)
        return final
    shutil.rmtree(final, ignore_errors=True)
    build.rename(final)
    return final


def clone_env(base: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """A copy of the venv ``base`` at ``dest`` made of hard links (seconds, no disk); its Python.

    pip replaces files (new inodes) and never writes into an installed one, so
    installing into the clone leaves ``base`` as it was.
    """
    subprocess.run(["cp", "-al", str(base), str(dest)], check=True)
    return dest / "bin" / "python"


def write_colab_stub(where: pathlib.Path) -> pathlib.Path:
    """Write a stand-in ``google.colab`` package under ``where``; return the folder."""
    for rel, text in STUB_COLAB.items():
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        (where / rel).write_text(text)
    return where


def run_in_venv(python: pathlib.Path, notebook: pathlib.Path, workdir: pathlib.Path, *,
                env: dict[str, str] | None = None, colab: bool = False) -> dict:
    """Run ``notebook`` in the venv of ``python`` (see :func:`_run`); return its result."""
    result = workdir / f"{notebook.stem}.result.json"
    cmd = [str(python), __file__, "run", str(notebook), "--workdir", str(workdir),
           "--result", str(result)] + (["--colab"] if colab else [])
    proc = subprocess.run(cmd, env={**_env(python), **(env or {})}, cwd=workdir,
                          capture_output=True, text=True, timeout=1800)
    assert result.exists(), f"runner failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(result.read_text())


def _env(python: pathlib.Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("BINDER_")}
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(python.parent.parent)
    return env


def _run(notebook: pathlib.Path, workdir: pathlib.Path, colab: bool) -> dict:
    """Execute ``notebook`` with nbclient in this interpreter's kernel (runs inside the venv).

    For Colab the setup cell's git URL points at the checkout and a first cell imports
    the ``google.colab`` stub, as Colab's kernel has it imported before any cell runs.
    """
    import nbclient
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    if colab:
        nb.cells[0].source = nb.cells[0].source.replace(GIT_URL, ROOT.as_uri())
        nb.cells.insert(0, nbformat.v4.new_code_cell("import google.colab"))
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    starts: dict[int, float] = {}
    seconds: dict[int, float] = {}
    client = nbclient.NotebookClient(
        nb, timeout=900, kernel_name="python3", allow_errors=False,
        resources={"metadata": {"path": str(workdir)}},
        on_cell_start=lambda cell, cell_index: starts.__setitem__(cell_index, time.perf_counter()),
        on_cell_executed=lambda cell, cell_index, execute_reply: seconds.__setitem__(
            cell_index, time.perf_counter() - starts[cell_index]))
    t0 = time.perf_counter()
    error = None
    try:
        client.execute()
    except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
        error = f"{type(exc).__name__}: {exc}"[-4000:]
    setup = 1 if colab else 0
    text = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []))
    return {
        "error": error, "seconds": time.perf_counter() - t0,
        "setup_seconds": seconds.get(setup),
        "setup_output": "".join(o.get("text", "") for o in nb.cells[setup].get("outputs", [])),
        "probe": json.loads(text.split("JL-PROBE ", 1)[1]) if "JL-PROBE " in text else None,
        "outputs": output_mimetypes(nb, skip=setup + 1),
        "stdout": "".join(o.get("text", "") for c in nb.cells[setup + 1:-1]
                          for o in c.get("outputs", []) if o.get("output_type") == "stream"),
        "executed": nb,  # the notebook with its outputs (the tests look for warnings in it)
    }


def output_mimetypes(nb, skip: int = 0) -> list[dict]:
    """Per rich output (display data, results) of the code cells after the first ``skip``:
    the cell's index among the notebook's own cells, its source's first line, the
    mimetypes and the plain-text form."""
    rows = []
    for index, cell in enumerate(nb.cells[skip:-1]):
        for out in cell.get("outputs", []):
            if out.get("output_type") in ("display_data", "execute_result"):
                rows.append({"cell": index + 1, "code": cell.source.strip().splitlines()[-1][:80],
                             "mimetypes": sorted(out["data"]),
                             "widget_view": out["data"].get(WIDGET_VIEW),
                             "text": str(out["data"].get("text/plain", ""))[:120]})
    return rows


def unrendered(rows: list[dict]) -> list[dict]:
    """The outputs of :func:`output_mimetypes` that Colab would show as bare text.

    An output with a rich mimetype must carry one of :data:`COLAB_RENDERS`; one with
    only ``text/plain`` must not be an object's repr standing in for a view
    (``<DagFigure: ...>``, ``Figure(...)``, ``VBox(...)``, ``DagWidget(...)``).
    """
    bad = []
    for row in rows:
        rich = set(row["mimetypes"]) - {"text/plain"}
        looks_like_view = row["text"].startswith(("<DagFigure", "Figure(", "VBox(", "HBox(",
                                                  "DagWidget(", "DagCursor(", "<jointlab"))
        if (rich and not rich & COLAB_RENDERS) or (not rich and looks_like_view):
            bad.append(row)
    return bad


def _main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="run one notebook in this interpreter's kernel")
    run.add_argument("notebook", type=pathlib.Path)
    run.add_argument("--workdir", type=pathlib.Path, required=True)
    run.add_argument("--result", type=pathlib.Path, required=True)
    run.add_argument("--colab", action="store_true")
    args = parser.parse_args(argv)
    result = _run(args.notebook, args.workdir, args.colab)
    args.result.write_text(json.dumps(result))
    sys.exit(1 if result["error"] else 0)


if __name__ == "__main__":
    _main(sys.argv[1:])
