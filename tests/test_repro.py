"""``compiled.repro(path)``: a standalone file that reproduces a divergence in a fresh process.

A deliberately wrong Inductor lowering (relu lowered as abs) is patched in for
one compile of the zoo's mlp and undone; the written file must fail when run
by a fresh interpreter that cannot import jointlab, and a clean compile has
nothing to reproduce. One clean and one wrong compile, plus the region's.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import jointlab as jl
from jointlab import torch_compat
from jointlab.errors import ReproError
from tests.fixtures import zoo
from tests.util import one_thread

aten = torch.ops.aten

# run a file as __main__ with jointlab unimportable: what "only torch installed" means
_NO_JOINTLAB = """
import importlib.abc, runpy, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "jointlab":
            raise ImportError("jointlab is not installed here")
sys.meta_path.insert(0, Block())
sys.argv = [sys.argv[1]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture(scope="module")
def mlp():
    f = zoo.FIXTURES["mlp"]
    model, inputs = f.make_model(), f.make_inputs(4)
    return model, inputs, jl.trace(model, f.train_fn, inputs)


def test_repro_of_a_wrong_lowering_fails_in_a_fresh_process(mlp, monkeypatch, tmp_path):
    model, inputs, joint = mlp
    lowering = torch_compat.torch_module("torch._inductor.lowering", "inject a wrong lowering")
    monkeypatch.setitem(lowering.lowerings, aten.relu.default, lowering.lowerings[aten.abs.default])
    with one_thread():
        bad = joint.compile("inductor")
        bad.run(model, inputs)
        monkeypatch.undo()  # the bug lives only in the code compiled above
        c = bad.compare(model, inputs)
        assert not c.ok
        r = bad.repro(tmp_path / "repro.py", model, inputs, comparison=c)
    relu = next(n for n in joint.graph.nodes if n.target is aten.relu.default)
    assert relu.name in r.region and r.kernel == c.kernels["inductor"].first.kernel
    text = r.path.read_text()
    assert jl.meta.info(relu)["source"] in text and jl.meta.info(relu)["module"] in text
    assert "import jointlab" not in text and r.inputs.exists()
    run = subprocess.run([sys.executable, "-I", "-c", _NO_JOINTLAB, str(r.path)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    print(run.stdout, run.stderr[-2000:])
    assert run.returncode == 1 and "DIVERGES" in run.stdout, run.stderr[-2000:]


def test_a_clean_compile_has_nothing_to_reproduce(mlp, tmp_path):
    model, inputs, joint = mlp
    with one_thread():
        clean = joint.compile("inductor")
        c = clean.compare(model, inputs)
        assert c.ok
        with pytest.raises(ReproError, match="nothing to reproduce"):
            clean.repro(tmp_path / "repro.py", model, inputs, comparison=c)
    assert not list(tmp_path.iterdir())
