"""``compiled.repro(path)``: a standalone file that reproduces a divergence in a fresh process.

Deliberately wrong Inductor lowerings are patched in for one compile and undone:
relu lowered as abs (forward) and, in the zoo's conv+BatchNorm net, ``le`` lowered
as ``lt`` (only relu's backward mask reads ``le``: a backward-only bug). The repro
must hold the nodes of the kernel compare named (checked against the kernel map,
Inductor's provenance for that kernel, with only the ``getitem`` nodes of
tuple-valued ops such as ``native_batch_norm`` added), fail when run by a fresh
interpreter that cannot import jointlab, and pass once the bug is gone (``--recompile``: the region
compiled by the torch at hand, whose lowerings are right again). A clean compile
has nothing to reproduce; repro reuses what bisect compiled (counted at
``torch_compat.inductor_compile``).
"""

from __future__ import annotations

import operator
import subprocess
import sys

import pytest
import torch

import jointlab as jl
from jointlab import torch_compat
from jointlab.analysis import repro as repro_mod
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
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _fresh(path, *flags):
    run = subprocess.run([sys.executable, "-I", "-c", _NO_JOINTLAB, str(path), *flags],
                         capture_output=True, text=True, cwd=path.parent, timeout=600)
    print(run.stdout, run.stderr[-2000:])
    return run


def _setup(name):
    f = zoo.FIXTURES[name]
    model, inputs = f.make_model(), f.make_inputs(4)
    return model, inputs, jl.trace(model, f.train_fn, inputs)


@pytest.fixture(scope="module")
def mlp():
    return _setup("mlp")


def _compiled_wrong(monkeypatch, joint, model, inputs, op, as_op):
    lowering = torch_compat.torch_module("torch._inductor.lowering", "inject a wrong lowering")
    monkeypatch.setitem(lowering.lowerings, op, lowering.lowerings[as_op])
    with one_thread():
        bad = joint.compile("inductor")
        bad.run(model, inputs)
    monkeypatch.undo()  # the bug lives only in the code compiled above
    return bad


def _kernel_origins(compiled, kernel):
    """The traced nodes Inductor's raw provenance derives ``kernel``'s post-grad nodes from."""
    prov = compiled.compiled.provenance
    names = {n.name for n in compiled.source.graph.nodes}
    return {p for post in prov["cppCodeToPost"][kernel] for p in prov["postToPre"].get(post, [])
            if p in names}


def _assert_kernel_sized(bad, r, c):
    first = c.kernels["inductor"].first
    assert r.cut == "kernel" and r.kernel == first.kernel, (r.cut, r.note)
    nodes = {n.name: n for n in bad.source.graph.nodes}
    items = [n for n in r.region if nodes[n].target is operator.getitem]
    # every getitem added reads a tuple-valued op of the kernel
    assert all(nodes[n].args[0].name in r.region for n in items)
    # the kernel map: Inductor's provenance less the nodes it only copies (issue 41 item 9)
    kernel_nodes = jl.analysis.kernels.kernel_map(bad)[r.kernel]
    assert sorted(set(r.region) - set(items)) == sorted(kernel_nodes)
    assert len(r.region) - len(items) == len(kernel_nodes)
    assert set(kernel_nodes) <= _kernel_origins(bad, r.kernel)


@pytest.mark.parametrize("case", ["forward relu as abs", "backward-only le as lt"])
def test_repro_is_kernel_sized_fails_fresh_and_passes_without_the_bug(monkeypatch, tmp_path,
                                                                      case):
    model, inputs, joint = _setup("cnn_bn")
    op, as_op = ((aten.relu.default, aten.abs.default) if case.startswith("forward")
                 else (aten.le.Scalar, aten.lt.Scalar))
    bad = _compiled_wrong(monkeypatch, joint, model, inputs, op, as_op)
    with one_thread():
        c = bad.compare(model, inputs)
        assert not c.ok
        r = bad.repro(tmp_path / "repro.py", model, inputs, comparison=c)
    print(r.cut, r.kernel, r.region, r.diverging, r.note)
    _assert_kernel_sized(bad, r, c)
    nodes = {n.name: n for n in joint.graph.nodes}
    if case.startswith("forward"):
        assert any(nodes[n].target is aten.relu.default for n in r.region)
    else:  # the bug shows in gradients only: every asserted output is a backward value
        assert all(jl.meta.phase(nodes[n]) == "backward" for n in r.diverging), r.diverging
        assert any(nodes[n].target is aten.threshold_backward.default for n in r.region)
    text = r.path.read_text()
    assert "import jointlab" not in text and r.inputs.exists() and r.generated == r.path
    assert 'GENERATED = r"""\n' in text and "\\n" not in text.split("GENERATED")[1][:2000]
    for n in r.region:  # each op is commented with its module and source line
        if nodes[n].target is not operator.getitem:
            info = jl.meta.info(nodes[n])
            assert f"# {info['module'] or '(root)'} ({info['module_type']}) · " \
                   f"{info['source']}" in text
    run = _fresh(r.path)
    assert run.returncode == 1 and "DIVERGES" in run.stdout, run.stderr[-2000:]
    fixed = _fresh(r.path, "--recompile")  # the lowering is right again in this torch
    assert fixed.returncode == 0 and "DIVERGES" not in fixed.stdout, fixed.stderr[-2000:]


def test_repro_reuses_what_bisect_compiled(mlp, monkeypatch, tmp_path):
    model, inputs, joint = mlp
    bad = _compiled_wrong(monkeypatch, joint, model, inputs, aten.relu.default,
                          aten.abs.default)
    calls = []
    compile_ = torch_compat.inductor_compile
    monkeypatch.setattr(torch_compat, "inductor_compile",
                        lambda *a, **k: calls.append(1) or compile_(*a, **k))
    with one_thread():
        c = bad.compare(model, inputs)
        assert calls == []  # compare reruns the whole graph's code: no compile
        found = jl.bisect(bad, model, inputs, regions=4)
        bisected = len(calls)
        assert bisected == len(found.regions) and found.first is not None
        # as when compare names no kernel: repro falls back to bisect's region
        with monkeypatch.context() as m:
            m.setattr(repro_mod, "_candidates", lambda comparison: [])
            r = bad.repro(tmp_path / "a.py", model, inputs, comparison=c)
        assert len(calls) == bisected, "repro recompiled a region bisect had compiled"
        assert r.cut == "bisect region" and r.region == found.first.nodes
        k = bad.repro(tmp_path / "b.py", model, inputs, comparison=c)  # the kernel: new
        assert k.cut == "kernel" and len(calls) == bisected + 1
        bad.repro(tmp_path / "c.py", model, inputs, comparison=c)
        jl.bisect(bad, model, inputs, regions=4)
        assert len(calls) == bisected + 1, "a second repro or bisect compiled again"
    assert _fresh(r.path).returncode == 1


def test_a_clean_compile_has_nothing_to_reproduce(mlp, tmp_path):
    model, inputs, joint = mlp
    with one_thread():
        clean = joint.compile("inductor")
        c = clean.compare(model, inputs)
        assert c.ok
        with pytest.raises(ReproError, match="nothing to reproduce"):
            clean.repro(tmp_path / "repro.py", model, inputs, comparison=c)
    assert not list(tmp_path.iterdir())
