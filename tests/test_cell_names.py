"""Source lines of code defined in notebook cells read ``cell [3], line 9``, as IPython shows them.

A real IPython shell compiles the cells (its ``run_cell``, which names each one a
temporary file the way a kernel does), so the reference is IPython's own
execution counts and the cells' own line numbers.
"""

from __future__ import annotations

import re

import pytest

IPython = pytest.importorskip("IPython")  # part of the dev environment: a hard dependency here

MODEL_CELL = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F

class CellMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
    def forward(self, x):
        return F.gelu(self.fc(x))

def step(model, x):
    return model(x).square().mean()

def printing_step(model, x):
    print(x.sum())
    return model(x).square().mean()

def backward_step(model, x):
    loss = model(x).square().mean()
    loss.backward()
    return loss
'''


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    sh = InteractiveShell.instance()
    yield sh
    InteractiveShell.clear_instance()


def _run(shell, code: str):
    count = shell.execution_count
    result = shell.run_cell(code, store_history=True)
    return count, result


def test_sources_name_the_cell_and_line(shell):
    model_cell, res = _run(shell, MODEL_CELL)
    assert res.success
    _, res = _run(shell, "import jointlab as jl\n"
                         "joint = jl.trace(CellMLP(), step, {'x': torch.randn(2, 8)})")
    assert res.success, res.error_in_exec
    src = shell.user_ns["joint"].nodes.set_index("target", append=True)["stack_trace"]
    gelu = {s for (_, t), s in src.items() if t == "aten.gelu"}
    loss = {s for (_, t), s in src.items() if t == "aten.mean"}
    assert gelu == {f"cell [{model_cell}], line 10"}
    assert loss == {f"cell [{model_cell}], line 13"}
    assert not any("ipython-input" in s or "ipykernel" in s for s in src)


def test_errors_name_the_cell_and_line(shell):
    model_cell, _ = _run(shell, MODEL_CELL)
    _, res = _run(shell, "import jointlab as jl\n"
                         "jl.trace(CellMLP(), printing_step, {'x': torch.randn(2, 8)})")
    err = res.error_in_exec
    assert err is not None and type(err).__module__.startswith("jointlab")
    assert re.search(rf"cell \[{model_cell}\], line 16: print\(x\.sum\(\)\)", str(err)), str(err)
    _, res = _run(shell, "jl.trace(CellMLP(), backward_step, {'x': torch.randn(2, 8)})")
    err = res.error_in_exec
    assert err is not None and type(err).__module__.startswith("jointlab")
    assert re.search(rf"cell \[{model_cell}\], line 21: loss\.backward\(\)", str(err)), str(err)


def test_outside_a_shell_files_keep_their_names():
    from jointlab.sources import source_location

    assert source_location("/tmp/ipykernel_1/123.py", 7) == "/tmp/ipykernel_1/123.py:7"
    assert source_location("/a/model.py", 7, short=True) == "model.py:7"
