"""Every notebook in notebooks/ runs top to bottom in a fresh kernel with zero errors.

The kernel is the ``python3`` kernelspec as jupyter_client resolves it from this
interpreter; a probe cell appended to each (in-memory) notebook checks that the
kernel really runs this virtual environment's Python, so a stray system kernel
cannot make the test pass on the wrong packages. Each notebook's run time is
printed (visible with ``pytest -s`` or in the report's captured output).
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
EXPECTED = ["01_quickstart", "02_memory", "03_debugging", "04_modes_and_shapes",
            "05_teaching_autodiff", "06_distributed", "07_compiled"]
PROBE = "import json, sys; print('JL-PROBE ' + json.dumps([sys.executable, sys.prefix]))"


def test_all_notebooks_present_and_clean():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), \
            f"{path.name} is committed with outputs"
        first = nb.cells[0]
        assert first.cell_type == "code", f"{path.name} must start with the setup cell"
        assert "google.colab" in first.source and '"-m", "pip", "install"' in first.source


def _errors(nb) -> list[str]:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                out.append(f"{o['ename']}: {o['evalue']}")
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_without_errors(path, tmp_path, capsys):
    if path.stem == "06_distributed":  # jl.fake_world refuses before torch 2.13
        import torch

        from jointlab.torch_compat import release
        from jointlab.torch_compat.distributed import DISTRIBUTED_SINCE

        if release(torch.__version__) < DISTRIBUTED_SINCE:
            pytest.skip("06_distributed uses jl.fake_world, which needs torch 2.13 or newer "
                        f"(refused with UnsupportedTorchError); this is torch {torch.__version__}")
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", allow_errors=False,
        resources={"metadata": {"path": str(tmp_path)}})
    t0 = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\n[notebook] {path.name}: {elapsed:.1f} s")
    assert _errors(nb) == []
    probe = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    exe, prefix = json.loads(probe.split("JL-PROBE ", 1)[1])
    assert pathlib.Path(prefix).resolve() == pathlib.Path(sys.prefix).resolve(), (exe, prefix)
    assert nb.cells[0].outputs == []  # outside Colab/Binder the setup cell does nothing
