"""The notebooks on simulated Colab and Binder hosts (see ``tests/hostsim.py``).

Colab (runs in CI, a few minutes): a fresh venv with torch 2.13.0 preinstalled
and the notebook stack; the setup cell of ``01_quickstart`` installs jointlab
from this checkout. It must not replace torch (same version, same file, same
inode: not even reinstalled), must finish (its time is printed), and the
notebook must then run to the end on the installed, not the checked-out, jointlab.

Binder (``make binder``; marked ``binder``, deselected by default): what
repo2docker does with ``binder/``, then every notebook.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from tests import hostsim

pytest.importorskip("nbclient")  # the suite's runner; the venvs install their own


def _assert_ran(result: dict, python: pathlib.Path) -> dict:
    assert result["error"] is None, result["error"]
    probe = result["probe"]
    assert probe is not None, result
    assert pathlib.Path(probe["prefix"]).resolve() == python.parent.parent.resolve(), probe
    return probe


def test_setup_cells_share_one_install_command():
    commands = {p.name: hostsim.setup_command(p) for p in sorted(hostsim.NOTEBOOKS.glob("*.ipynb"))}
    assert len(set(commands.values())) == 1, commands
    assert hostsim.GIT_URL in next(iter(commands.values()))


def test_colab_setup_cell_keeps_torch_and_runs_quickstart(tmp_path, capsys):
    python = hostsim.make_venv(tmp_path / "colab")
    t_torch = hostsim.pip(python, hostsim.TORCH_PIN)
    t_stack = hostsim.pip(python, *hostsim.COLAB_STACK)
    before = hostsim.torch_stamp(python)
    assert before["version"].startswith("2.13.0"), before
    stub = hostsim.write_colab_stub(tmp_path / "stub")
    work = tmp_path / "work"
    work.mkdir()
    notebook = hostsim.NOTEBOOKS / "01_quickstart.ipynb"
    result = hostsim.run_in_venv(python, notebook, work, colab=True,
                                 env={"PYTHONPATH": str(stub)})
    probe = _assert_ran(result, python)
    with capsys.disabled():
        print(f"\n[colab] torch {t_torch:.0f} s, notebook stack {t_stack:.0f} s, "
              f"setup cell (pip install jointlab[notebook]) {result['setup_seconds']:.0f} s, "
              f"whole notebook {result['seconds']:.0f} s")
    assert hostsim.torch_stamp(python) == before  # not replaced, not even reinstalled
    assert probe["torch"] == before["version"] and probe["torch_file"] == before["file"]
    # the cell took its Colab branch: it installed jointlab into the venv and
    # enabled Colab's widget manager (anywidget calls it too, on Colab)
    site = python.parent.parent.resolve()
    assert pathlib.Path(probe["jointlab_file"]).resolve().is_relative_to(site), probe
    assert probe["jointlab_dist"] and "enable_custom_widget_manager" in probe["colab_calls"]


def _binder_requirements(tmp_path: pathlib.Path) -> pathlib.Path:
    """binder/requirements.txt without its (unreachable) extra index: torch comes from disk."""
    text = (hostsim.ROOT / "binder" / "requirements.txt").read_text()
    kept = [ln for ln in text.splitlines() if not ln.startswith("--extra-index-url")]
    assert len(kept) == len(text.splitlines()) - 1 and hostsim.TORCH_PIN in kept, text
    out = tmp_path / "requirements.txt"
    out.write_text("\n".join(kept) + "\n")
    return out


@pytest.mark.binder
def test_binder_build_runs_every_notebook(tmp_path, capsys):
    runtime = (hostsim.ROOT / "binder" / "runtime.txt").read_text().strip()
    python = hostsim.make_venv(tmp_path / "binder")
    version = hostsim.subprocess.run([str(python), "-c", "import sys; print(sys.version)"],
                                     check=True, capture_output=True, text=True).stdout
    assert re.fullmatch(r"python-(\d+\.\d+)", runtime) and version.startswith(runtime[7:])
    t_req = hostsim.pip(python, "-r", str(_binder_requirements(tmp_path)), cwd=hostsim.ROOT)
    post = hostsim.subprocess.run(["bash", str(hostsim.ROOT / "binder" / "postBuild")],
                                  cwd=hostsim.ROOT, env=hostsim._env(python),
                                  capture_output=True, text=True, check=True)
    for ext in ("jupyterlab-plotly", "@jupyter-widgets/jupyterlab-manager", "anywidget"):
        assert ext in post.stdout, post.stdout + post.stderr
    times = {}
    for notebook in sorted(hostsim.NOTEBOOKS.glob("*.ipynb")):
        work = tmp_path / notebook.stem
        work.mkdir()
        result = hostsim.run_in_venv(python, notebook, work,
                                     env={"BINDER_LAUNCH_HOST": "https://mybinder.org/"})
        probe = _assert_ran(result, python)
        assert probe["torch"].startswith("2.13.0"), probe
        # the image's editable install serves the notebooks; the setup cell installs nothing
        assert pathlib.Path(probe["jointlab_file"]).resolve().is_relative_to(hostsim.ROOT)
        assert result["setup_output"] == "", result["setup_output"]
        times[notebook.stem] = result["seconds"]
    with capsys.disabled():
        print(f"\n[binder] requirements.txt {t_req:.0f} s, notebooks "
              + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()))
