"""``jl.bisect``: a deliberately wrong Inductor lowering is found in the region that holds its op.

One whole-graph Inductor compile and one clean bisection of the zoo's mlp serve the module.
"""

from __future__ import annotations

import pytest
import torch

import jointlab as jl
from jointlab import torch_compat
from jointlab.errors import CompiledGraphError
from tests.fixtures import zoo
from tests.util import assert_unchanged, deep_state, one_thread

aten = torch.ops.aten


@pytest.fixture(scope="module")
def mlp_bisected():
    with one_thread():  # the setup and every test of the module
        f = zoo.FIXTURES["mlp"]
        model, inputs = f.make_model(), f.make_inputs(4)
        joint = jl.trace(model, f.train_fn, inputs)
        compiled = joint.compile("inductor")
        compiled.run(model, inputs)  # the whole-graph kernel map
        before = deep_state(model)
        clean = jl.bisect(compiled, model, inputs, regions=4)
        assert_unchanged(before, model)
        yield model, inputs, joint, compiled, clean


def _compute(joint):
    return [n.name for n in joint.graph.nodes if n.op not in ("placeholder", "output")]


def test_unmodified_compiled_graph_bisects_clean(mlp_bisected):
    model, inputs, joint, compiled, clean = mlp_bisected
    print(clean)
    assert clean.ok and clean.first is None and clean.granularity == "region"
    assert all(c.ok for c in clean.checks) and len(clean.checks) >= len(clean.regions)
    # contiguous regions in node order that cover every compute node once
    assert [n for r in clean.regions for n in r.nodes] == _compute(joint)
    assert 3 <= len(clean.regions) <= 6
    assert all(r.phase in ("forward", "backward") for r in clean.regions)
    # the whole graph's kernel map names the kernels of each region; every addmm is extern
    for r in clean.regions:
        assert r.kernels, r
        if "addmm" in r.nodes:
            assert any(k.startswith("extern_kernels.addmm") for k in r.kernels)


def test_wrong_relu_lowering_is_named_in_the_region_that_holds_relu(mlp_bisected, monkeypatch):
    model, inputs, joint, compiled, clean = mlp_bisected
    lowering = torch_compat.torch_module("torch._inductor.lowering", "inject a wrong lowering")
    monkeypatch.setitem(lowering.lowerings, aten.relu.default, lowering.lowerings[aten.abs.default])
    # no FX-graph cache: a cached clean compile would hide the bug (and must not learn it)
    bad = jl.bisect(compiled, model, inputs, regions=4, options={"fx_graph_cache": False})
    print(bad)
    # independent reference: relu's position among the graph's compute nodes
    names = _compute(joint)
    pos = names.index(next(n.name for n in joint.graph.nodes if n.target is aten.relu.default))
    starts = [names.index(r.nodes[0]) for r in bad.regions]
    expected = max(i for i, s in enumerate(starts) if s <= pos)
    assert not bad.ok and bad.first.index == expected
    assert bad.first.phase == "forward"
    assert all(c.ok for c in bad.checks if c.region < expected)
    assert any(c.node == "relu" and not c.ok for c in bad.checks)
    # later regions get the uncompiled values at their inputs: the error does not spread
    assert all(c.ok for c in bad.checks if c.region > expected)


def test_bisect_refuses_a_traced_graph(mlp_bisected):
    model, inputs, joint, *_ = mlp_bisected
    with pytest.raises(CompiledGraphError, match="jl.compare"):
        jl.bisect(joint, model, inputs)


def test_refusal_points_at_bisect(mlp_bisected):
    *_, compiled, _ = mlp_bisected
    with pytest.raises(CompiledGraphError, match=r"jl\.bisect\(compiled, model, inputs\)"):
        compiled.memory()  # jl.Stepper(compiled) steps it: tests/test_compiled_step.py
