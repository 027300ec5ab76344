"""Inductor kernels mapped onto the joint graph, and compiled compares with a float64 reference.

One Inductor compile of the zoo's two-layer GPT (tiny_lm) serves the module.
"""

from __future__ import annotations

import pytest
import torch

import jointlab as jl
from jointlab.analysis import kernels as K
from jointlab.errors import CompiledGraphError
from tests.fixtures import zoo
from tests.util import one_thread


@pytest.fixture(scope="module")
def tiny_compiled():
    with one_thread():  # the setup and every test of the module
        f = zoo.FIXTURES["tiny_lm"]
        model, inputs = f.make_model(), f.make_inputs(2)
        joint = jl.trace(model, f.train_fn, inputs)
        compiled = joint.compile("inductor")
        cmp = compiled.compare(model, inputs, train_fn=f.train_fn)
        yield f, model, inputs, joint, compiled, cmp


def test_inductor_compiles_the_traced_graph_and_compares_within_tolerance(tiny_compiled):
    *_, joint, compiled, cmp = tiny_compiled
    assert cmp.ok, cmp
    assert {"inductor", "graph"} <= set(cmp.grads["candidate"])
    # the compiled side ran other kernels: a float64 reference tells who is closer
    assert cmp.fp64 is not None and len(cmp.fp64) == 1 + len(joint.param_names)
    assert set(cmp.fp64["closer"]) <= {"inductor", "eager", "tie"}


def test_kernel_table_covers_matmuls_with_extern_calls(tiny_compiled):
    *_, joint, compiled, _ = tiny_compiled
    tab = K.kernel_table(compiled)
    assert list(tab.columns) == ["name", "kind", "nodes", "modules", "phase", "source"]
    assert len(tab) > 10 and set(tab["kind"]) >= {"extern", "fused pointwise"}
    col = K.kernel_column(compiled)
    by_name = {n.name: n for n in joint.graph.nodes}
    # independent check: each mapped addmm node of the graph is covered by an extern addmm
    for name, n in by_name.items():
        if n.target is torch.ops.aten.addmm.default and col[name]:
            assert any(k.startswith("extern_kernels.addmm") for k in col[name].split(", ")), name
    fused = tab[tab["kind"] != "extern"]
    assert all("void" in src and "kernel" in src for src in fused["source"])
    assert set(col.index) == set(by_name)
    for kernel, row in tab.iterrows():
        for n in row["nodes"]:
            assert kernel in col[n].split(", ")


def test_coverage_of_compute_nodes_is_reported(tiny_compiled):
    *_, joint, compiled, _ = tiny_compiled
    cov = K.kernel_coverage(compiled)
    print(cov)
    compute = [n for n in joint.graph.nodes if K.is_compute(n)]
    assert cov.compute == len(compute) > 50
    assert cov.share >= 0.98  # measured 94/95; the miss (mm_1) is listed, not guessed
    col = K.kernel_column(compiled)
    assert all(col[n] == "" for n in cov.unmapped)
    assert all(col[n.name] for n in compute if n.name not in cov.unmapped)


def test_no_kernel_map_without_inductor_provenance():
    f = zoo.FIXTURES["mlp"]
    model, inputs = f.make_model(), f.make_inputs(4)
    compiled = jl.trace(model, f.train_fn, inputs).compile("aot_eager")
    with pytest.raises(CompiledGraphError, match="backend='aot_eager'"):
        K.kernel_table(compiled)
    not_run = jl.trace(model, f.train_fn, inputs).compile("inductor")
    with pytest.raises(CompiledGraphError, match="has not run yet"):
        K.kernel_coverage(not_run)
