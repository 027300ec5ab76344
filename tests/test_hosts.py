"""The notebooks on simulated Colab and Binder hosts (see ``tests/hostsim.py``).

Colab, always on (``make test``, about 2 minutes, the host venv cached after the
first run): :data:`hostsim.COLAB_LIGHT`, Colab's published versions of the
notebook stack (ipywidgets 7.7.1, plotly 5.24.1, ...) with the dev torch 2.13.0
from local disk on this Python; a resolver check that ``jointlab[colab]`` asks
nothing of Colab's stack that it lacks (torch 2.11 included); and
``01_quickstart``'s own setup cell installing this checkout. ``pip list`` before
and after may differ only by jointlab, the cell prints one line and no restart
notice, and every DAG and widget output carries a mimetype Colab renders. The same
host serves ipywidgets 7's own front end (classic Notebook 6.5.7) to Chromium,
where explore and the stepper panel are used as a user uses them
(``tests/classic_front.py``).

Colab, full (``make colab``; marked ``colab``): the published stack itself,
torch 2.11.0 and Python 3.13 where this machine has one, then notebooks 01, 03
and 05.

Binder (``make binder``; marked ``binder``, deselected by default): what
repo2docker does with ``binder/``, then every notebook.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

from tests import classic_front, hostsim
from tests.chromium import chromium_path
from tests.test_browser import _free_port
from tests.test_notebooks import _unexplained_warnings, nbformat

pytest.importorskip("nbclient")  # the suite's runner; the venvs install their own
tomllib = pytest.importorskip("tomllib", reason="needs Python 3.11+ to read pyproject.toml")
RESTART = re.compile(r"restart", re.IGNORECASE)


def _assert_ran(result: dict, python: pathlib.Path) -> dict:
    assert result["error"] is None, result["error"]
    probe = result["probe"]
    assert probe is not None, result
    assert pathlib.Path(probe["prefix"]).resolve() == python.parent.parent.resolve(), probe
    return probe


def test_setup_cells_share_one_install_command():
    commands = {p.name: hostsim.setup_command(p) for p in sorted(hostsim.NOTEBOOKS.glob("*.ipynb"))}
    assert len(set(commands.values())) == 1, commands
    assert next(iter(commands.values())) == f"jointlab[{hostsim.COLAB_EXTRA}] @ {hostsim.GIT_URL}"
    for path in hostsim.NOTEBOOKS.glob("*.ipynb"):
        source = "".join(json.loads(path.read_text())["cells"][0]["source"])
        # IPython's %pip always prints "you may need to restart the kernel"
        assert "%pip" not in source and "!pip" not in source, path.name


def _requirements(extra: str | None = None) -> list[Requirement]:
    project = tomllib.loads((hostsim.ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for r in project["optional-dependencies"].get(extra, []) if extra else []:
        req = Requirement(r)
        if req.name == "jointlab":
            for sub in req.extras:
                reqs += [x for x in _requirements(sub) if x not in reqs]
        else:
            reqs.append(req)
    return reqs


def test_colab_extra_needs_nothing_colab_lacks(tmp_path):
    """jointlab[colab] is satisfied by Colab's own versions, so pip upgrades none of them."""
    reqs = _requirements(hostsim.COLAB_EXTRA)
    names = {r.name for r in reqs}
    assert "jupyterlab" not in names and names <= set(hostsim.COLAB_HOST), names
    for req in reqs:
        host = hostsim.COLAB_HOST[req.name]
        for version in (host, f"{host}+cpu", f"{host}+cu128"):
            assert req.specifier.contains(version), (str(req), version)
    # and what those versions need in turn resolves together with the pins (torch apart:
    # its wheel is 900 MB; its own dependencies are not jointlab's to change)
    pins = [f"{k}=={v}" for k, v in hostsim.COLAB_HOST.items() if k != "torch"]
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
           "--report", "-", "--only-binary=:all:", "--python-version", hostsim.COLAB_PYTHON,
           "--target", str(tmp_path / "target"),  # older pips want it with --python-version
           *[str(r) for r in reqs if r.name != "torch"], *pins]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                         env={**hostsim._env(pathlib.Path(sys.executable)),
                              "PIP_CONSTRAINT": "/dev/null"})
    assert out.returncode == 0, out.stderr[-3000:]
    chosen = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
              for i in json.loads(out.stdout)["install"]}
    for name, version in hostsim.COLAB_HOST.items():
        if name != "torch":
            assert chosen[name.lower().replace("_", "-")] == version, (name, chosen)


def _check_colab_run(result: dict, before: dict, after: dict) -> dict:
    diff = hostsim.list_diff(before, after)
    assert diff["removed"] == [] and diff["changed"] == [], diff  # nothing the host has
    assert [a.split()[0] for a in diff["added"]] == ["jointlab"], diff
    setup = result["setup_output"]
    assert not RESTART.search(setup), setup
    lines = setup.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Installed jointlab"), setup
    assert "CHANGED" not in setup and "kept torch" in setup, setup
    bad = hostsim.unrendered(result["outputs"])
    assert not bad, f"outputs Colab would show as bare text: {bad}"
    assert _unexplained_warnings(nbformat.from_dict(result["executed"])) == []
    return diff


def _report(capsys, label: str, note: str, result: dict, diff: dict, notebook: str) -> None:
    with capsys.disabled():
        print(f"\n[{label}] {note}; {notebook}: setup cell {result['setup_seconds']:.0f} s "
              f"({result['setup_output'].strip()}), whole notebook {result['seconds']:.0f} s; "
              f"pip list diff {diff}")
        for row in result["outputs"]:
            if set(row["mimetypes"]) - {"text/plain"}:
                kinds = ", ".join(row["mimetypes"])
                print(f"  cell {row['cell']:>2} {row['code'][:50]:<50} {kinds}")


def _colab_run(tmp_path, base: pathlib.Path, notebook: str) -> tuple[pathlib.Path, dict, dict,
                                                                     dict, dict]:
    python = hostsim.clone_env(base, tmp_path / f"colab-{notebook}")
    before, stamp = hostsim.pip_list(python), hostsim.torch_stamp(python)
    stub = hostsim.write_colab_stub(tmp_path / "stub")
    work = tmp_path / f"work-{notebook}"
    work.mkdir()
    result = hostsim.run_in_venv(python, hostsim.NOTEBOOKS / f"{notebook}.ipynb", work,
                                 colab=True, env={"PYTHONPATH": str(stub)})
    probe = _assert_ran(result, python)
    assert hostsim.torch_stamp(python) == stamp  # not replaced, not even reinstalled
    assert probe["torch"] == stamp["version"] and probe["torch_file"] == stamp["file"]
    # the cell took its Colab branch: it installed jointlab into the venv and
    # enabled Colab's widget manager (anywidget calls it too, on Colab)
    site = python.parent.parent.resolve()
    assert pathlib.Path(probe["jointlab_file"]).resolve().is_relative_to(site), probe
    assert probe["jointlab_dist"] and "enable_custom_widget_manager" in probe["colab_calls"]
    return python, before, hostsim.pip_list(python), result, probe


def _check_widgets(python: pathlib.Path, tmp_path: pathlib.Path) -> dict:
    """Every jointlab widget, built in the host's kernel and driven through its comms as
    the browser's widget manager does (:data:`hostsim.WIDGET_CELLS`)."""
    work = tmp_path / "work-widgets"
    work.mkdir()
    notebook = hostsim.write_widget_notebook(work / "widgets.ipynb")
    result = hostsim.run_in_venv(python, notebook, work, colab=True,
                                 env={"PYTHONPATH": str(tmp_path / "stub")})
    _assert_ran(result, python)
    report = json.loads(result["stdout"].split("JL-WIDGETS ", 1)[1])
    # the displayed outputs: one widget view each (protocol 2, which ipywidgets 7 and 8
    # both render), of the root widget built in that cell
    views = [row["widget_view"] for row in result["outputs"]]
    assert [v and v["version_major"] for v in views] == [2, 2], result["outputs"]
    assert [v["model_id"] for v in views] == list(report["view_ids"].values()), report
    assert report["views"] == dict(zip(report["view_ids"], views)), report
    assert report["serialisable"], report  # every model's state goes over the comm as JSON
    assert report["dag_widgets"] == ["DagWidget", "DagCursor"], report  # explore's, the panel's
    # what the browser sends fires the callbacks: search, canvas click, phase toggle,
    # collapse dropdown, the stepper's Step button (twice)
    assert report["search"]["chosen"] and all("addmm" in n for n in report["search"]["chosen"])
    assert "selected" in report["search"]["status"], report
    click = report["click"]
    assert {click["node"], click["twin"]} <= set(click["selected"]), click
    assert report["hidden"] == ["backward"], report
    assert report["depth"]["view"] == report["depth"]["control"] == report["depth"]["want"]
    step = report["step"]
    assert step["position"] == 2 and step["label"].startswith("position 2 /"), step
    assert step["ring"] == step["current"], step
    return report


def test_colab_setup_cell_upgrades_nothing_and_quickstart_renders(tmp_path, capsys):
    base = hostsim.host_env("colab-light", pathlib.Path(sys.executable), hostsim.COLAB_LIGHT
                            + hostsim.COLAB_RUNNER)
    python, before, after, result, _ = _colab_run(tmp_path, base, "01_quickstart")
    assert before["ipywidgets"] == "7.7.1" and before["plotly"] == "5.24.1", before
    diff = _check_colab_run(result, before, after)
    _report(capsys, "colab, light", f"Python {sys.version.split()[0]}, torch 2.13.0", result,
            diff, "01_quickstart")
    widgets = _check_widgets(python, tmp_path)
    assert widgets["ipywidgets"] == "7.7.1", widgets
    with capsys.disabled():
        print(f"  widgets under ipywidgets {widgets['ipywidgets']}: explore and stepper "
              f"views {widgets['views']}, models {widgets['modules']}; callbacks fired")


def test_widgets7_front_end_renders_and_drives_every_widget(tmp_path, capsys):
    """ipywidgets 7's own front end (classic Notebook 6.5.7, Colab's versions) in Chromium:
    explore and the stepper panel render, and search, phase toggle and Step work."""
    chromium_path()  # skip, saying why, before building anything when there is no browser
    base = hostsim.host_env("colab-light", pathlib.Path(sys.executable), hostsim.COLAB_LIGHT
                            + hostsim.COLAB_RUNNER)
    python = hostsim.clone_env(base, tmp_path / "host")
    hostsim.pip(python, "--no-deps", str(hostsim.ROOT))
    got = classic_front.drive_widgets(python, tmp_path / "classic", _free_port())
    ref = got["ref"]
    assert got["errors"] == [], got["errors"]  # every widget model built, nothing thrown
    # explore: the whole graph drawn; the search typed in the page lists exactly the
    # kernel's addmm nodes in the table; hiding backward leaves the other phases' nodes
    assert got["visible_all"] == ref["nodes"], got
    assert got["visible_forward"] == ref["not_backward"], got
    # the stepper panel: three clicks on Step, three nodes run
    assert got["position_before"] == f"position 0 / {ref['nodes']}", got
    assert got["position_after"] == f"position 3 / {ref['nodes']}", got
    assert sorted(got["table_rows"]) == sorted(ref["addmm"]) and ref["addmm"], got
    with capsys.disabled():
        print(f"\n[widgets 7 front end] classic Notebook {hostsim.COLAB_HOST['notebook']}, "
              f"widgetsnbextension {hostsim.COLAB_HOST['widgetsnbextension']}: explore drew "
              f"{got['visible_all']} nodes, search listed {got['table_rows']}, Step reached "
              f"'{got['position_after']}'; screenshots in {got['shots']}")


@pytest.mark.colab
@pytest.mark.parametrize("notebook", ["01_quickstart", "03_debugging", "05_teaching_autodiff"])
def test_colab_published_stack_runs_the_notebooks(tmp_path, capsys, notebook):
    python, note = hostsim.find_python(hostsim.COLAB_PYTHON)
    stack = [f"{k}=={v}" for k, v in hostsim.COLAB_HOST.items()] + hostsim.COLAB_RUNNER
    base = hostsim.host_env("colab", python, stack)
    python, before, after, result, probe = _colab_run(tmp_path, base, notebook)
    assert probe["torch"].startswith(hostsim.COLAB_HOST["torch"]), probe
    assert before["ipywidgets"] == hostsim.COLAB_HOST["ipywidgets"], before
    diff = _check_colab_run(result, before, after)
    _report(capsys, "colab", f"{note}, torch {probe['torch']}", result, diff, notebook)
    if notebook == "01_quickstart":  # once: the widgets on Colab's torch and Python
        assert _check_widgets(python, tmp_path)["ipywidgets"] == hostsim.COLAB_HOST["ipywidgets"]


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
        assert _unexplained_warnings(nbformat.from_dict(result["executed"])) == []
        times[notebook.stem] = result["seconds"]
    with capsys.disabled():
        print(f"\n[binder] requirements.txt {t_req:.0f} s, notebooks "
              + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()))


def test_binder_requirements_leave_jointlab_to_postbuild():
    """No local path in requirements.txt (repo2docker then caches its torch layer); they
    still cover every requirement of jointlab[notebook], and postBuild installs jointlab."""
    lines = [ln.split("#")[0].strip()
             for ln in (hostsim.ROOT / "binder" / "requirements.txt").read_text().splitlines()]
    reqs = [ln for ln in lines if ln and not ln.startswith("--")]
    assert not any(r.startswith(("-e", ".", "/")) or "file:" in r for r in reqs), reqs
    listed = {Requirement(r).name.lower() for r in reqs}
    needed = {r.name.lower() for r in _requirements("notebook")}
    assert needed <= listed, needed - listed
    post = (hostsim.ROOT / "binder" / "postBuild").read_text()
    assert 'pip install --no-cache-dir -q -e ".[notebook]"' in post
    assert "|| true" not in post and "set -euo pipefail" in post


GREEN, RED, PLAIN = "\\033[32m", "\\033[31m", "\\033[0m"  # as jupyter colours the words
ON = f"{GREEN}enabled{PLAIN} {GREEN}OK{PLAIN}"


@pytest.mark.parametrize("listed, ok, why", [
    ({"jupyterlab-plotly": ON, "@jupyter-widgets/jupyterlab-manager": ON, "anywidget": ON},
     True, ""),
    ({"jupyterlab-plotly": ON, "@jupyter-widgets/jupyterlab-manager": ON}, False,
     "anywidget is not installed"),
    ({"jupyterlab-plotly": ON, "@jupyter-widgets/jupyterlab-manager": ON,
      "anywidget": f"{RED}disabled{PLAIN} {GREEN}OK{PLAIN}"}, False,
     "anywidget is installed but not active"),
    ({"jupyterlab-plotly": f"{GREEN}enabled{PLAIN} {RED}X{PLAIN}",
      "@jupyter-widgets/jupyterlab-manager": ON, "anywidget": ON}, False,
     "jupyterlab-plotly is installed but not active")])
def test_postbuild_fails_when_an_extension_is_missing_or_disabled(tmp_path, listed, ok, why):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text("#!/bin/sh\nexit 0\n")  # stands in for pip and the import
    (fake / "jupyter").write_text("#!/bin/bash\n" + "".join(
        f"echo -e '        {ext} v1.0.0 {state} (python, x)'\n" for ext, state in listed.items()))
    for f in fake.iterdir():
        f.chmod(0o755)
    run = subprocess.run(["bash", str(hostsim.ROOT / "binder" / "postBuild")], cwd=tmp_path,
                         capture_output=True, text=True, env={"PATH": f"{fake}:/usr/bin:/bin"})
    assert (run.returncode == 0) is ok, run.stdout + run.stderr
    assert why in run.stderr
