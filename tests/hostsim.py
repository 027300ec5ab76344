"""Simulated Colab and Binder hosts: fresh virtual environments that run the notebooks.

Neither host can be reached from CI, so this does what each would do, as far as
one machine allows:

* **Colab**: a venv with a preinstalled torch and the notebook stack; then the
  notebook's own setup cell runs, its ``%pip install`` pointed at this checkout
  instead of the git URL, with ``google.colab`` stubbed so the cell takes its
  Colab branch.
* **Binder** (repo2docker): a venv built from ``binder/requirements.txt`` (torch
  from local disk instead of the unreachable CPU index), then ``binder/postBuild``,
  then every notebook with ``BINDER_*`` set.

The module is imported by ``tests/test_hosts.py`` and also executed by each
venv's own Python (``python hostsim.py run ...``) to run a notebook there, so
its top level imports only the standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
GIT_URL = "git+https://github.com/jointlab/jointlab"
TORCH_PIN = "torch==2.13.0"  # the CPU build on local disk stands in for the host's torch
# What Colab preinstalls that the notebooks touch (pandas, plotly, ipywidgets, a
# kernel), plus nbclient to run the notebook with.
COLAB_STACK = ["numpy", "pandas", "plotly", "ipywidgets", "ipykernel", "nbclient", "nbformat"]
PIP_TIMEOUT_S = 900
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
    """The ``%pip install`` line of ``notebook``'s setup cell (its first cell)."""
    cell = json.loads(notebook.read_text())["cells"][0]
    lines = [ln.strip() for ln in "".join(cell["source"]).splitlines()]
    installs = [ln for ln in lines if ln.startswith("%pip install")]
    assert len(installs) == 1, f"{notebook.name}: expected one %pip install line, got {installs}"
    return installs[0]


def local_command(command: str, checkout: pathlib.Path = ROOT) -> str:
    """``command`` with the git URL replaced by ``checkout`` (a ``file://`` URL)."""
    assert command.count(GIT_URL) == 1, command
    return command.replace(GIT_URL, checkout.as_uri())


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
    }


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
