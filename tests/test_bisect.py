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
    assert clean.notes == ()  # built under today's state
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


def _wrong_relu(monkeypatch):
    lowering = torch_compat.torch_module("torch._inductor.lowering", "inject a wrong lowering")
    monkeypatch.setitem(lowering.lowerings, aten.relu.default, lowering.lowerings[aten.abs.default])


def test_wrong_relu_lowering_is_named_in_the_region_that_holds_relu(mlp_bisected, monkeypatch):
    model, inputs, joint, _, _ = mlp_bisected
    # notebook 07's order: the bug is patched in for the compile and undone right after
    _wrong_relu(monkeypatch)
    bad = joint.compile("inductor")
    bad.run(model, inputs)
    monkeypatch.undo()
    found = jl.bisect(bad, model, inputs, regions=4)
    print(found)
    # independent reference: relu's position among the graph's compute nodes
    names = _compute(joint)
    pos = names.index(next(n.name for n in joint.graph.nodes if n.target is aten.relu.default))
    starts = [names.index(r.nodes[0]) for r in found.regions]
    expected = max(i for i, s in enumerate(starts) if s <= pos)
    assert not found.ok and found.first.index == expected
    assert found.first.phase == "forward"
    assert all(c.ok for c in found.checks if c.region < expected)
    assert any(c.node == "relu" and not c.ok for c in found.checks)
    # later regions get the uncompiled values at their inputs: the error does not spread
    assert all(c.ok for c in found.checks if c.region > expected)
    # the state that built it differs from today's, and the result says so
    assert any("lowering of aten.relu.default" in n for n in found.notes), found.notes
    # the same object compared as a whole: MISMATCH too, never "clean" beside it
    assert not jl.compare(bad, model, inputs).ok


def test_bisect_checks_the_clean_code_held_even_while_a_bug_is_patched_in(mlp_bisected,
                                                                          monkeypatch):
    model, inputs, _, compiled, _ = mlp_bisected  # compiled before any patch: clean code
    _wrong_relu(monkeypatch)
    calls = []
    compile_ = torch_compat.inductor_compile
    monkeypatch.setattr(torch_compat, "inductor_compile",
                        lambda *a, **k: calls.append(1) or compile_(*a, **k))
    # options other than the fixture's (a default value): every region is compiled now,
    # under the patch, not taken from the fixture's bisect
    found = jl.bisect(compiled, model, inputs, regions=4, options={"max_autotune": False})
    print(found)
    assert found.ok, found
    assert len(calls) == len(found.regions), "regions reused, not compiled under the patch"
    assert any("lowering of aten.relu.default" in n for n in found.notes), found.notes
    lowering = torch_compat.torch_module("torch._inductor.lowering", "check the patch stays")
    assert lowering.lowerings[aten.relu.default] is lowering.lowerings[aten.abs.default]


def test_bisect_refuses_a_traced_graph(mlp_bisected):
    model, inputs, joint, *_ = mlp_bisected
    with pytest.raises(CompiledGraphError, match="jl.compare"):
        jl.bisect(joint, model, inputs)


def test_refusal_points_at_bisect(mlp_bisected):
    *_, compiled, _ = mlp_bisected
    with pytest.raises(CompiledGraphError, match=r"jl\.bisect\(compiled, model, inputs\)"):
        compiled.memory()  # jl.Stepper(compiled) steps it: tests/test_compiled_step.py


def test_unmodified_compiled_graph_matches_kernel_by_kernel(mlp_bisected):
    model, inputs, joint, compiled, _ = mlp_bisected
    from jointlab.analysis.compare.compare import Tolerance
    from jointlab.analysis.kernel_probe import kernel_calls

    check = compiled.first_diverging_kernel(model, inputs, Tolerance(floor=torch.float32))
    calls = kernel_calls(compiled.compiled.source_code)
    # every kernel call of the generated code wrote a buffer that was compared
    assert check.first is None and check.unchecked == () and check.note == ""
    assert check.checked == len(calls) == len(jl.analysis.kernels.kernel_map(compiled))
    c = jl.compare(compiled, model, inputs)
    assert c.ok and c.kernels is None, c


def test_compare_names_the_kernel_that_a_wrong_relu_lowering_broke(mlp_bisected, monkeypatch):
    model, inputs, joint, _, _ = mlp_bisected
    lowering = torch_compat.torch_module("torch._inductor.lowering", "inject a wrong lowering")
    monkeypatch.setitem(lowering.lowerings, aten.relu.default, lowering.lowerings[aten.abs.default])
    bad = joint.compile("inductor")
    bad.run(model, inputs)  # compiled with the wrong lowering (the FX-graph cache is off)
    monkeypatch.undo()
    before = deep_state(model)
    c = jl.compare(bad, model, inputs)
    assert_unchanged(before, model)
    print(c)
    assert not c.ok and set(c.kernels) == {"inductor"}
    first = c.kernels["inductor"].first
    # independent reference: the kernel Inductor's own provenance says covers relu
    relu = next(n for n in joint.graph.nodes if n.target is aten.relu.default)
    (want,) = jl.analysis.kernels.kernel_column(bad)[relu.name].split(", ")
    assert first is not None and first.kernel == want
    assert relu.name in first.nodes and first.kind == "fused pointwise"
    assert jl.meta.info(relu)["source"] in first.sources
    assert "abs()" in first.code and "abs()" in bad.compiled.source_code
    calls = [k.kernel for k in jl.analysis.kernel_probe.kernel_calls(bad.compiled.source_code)]
    assert c.kernels["inductor"].checked == calls.index(want) + 1  # the ones before matched
    assert f"first diverging kernel (inductor): {want}" in repr(c)
    # first_divergence names it too, not only the repr
    d = c.first_divergence
    assert d is not None and d.candidate == "inductor" and d.kernel == want, d
    assert d.node in first.nodes or d.node == first.node


_WRAPPER = '''
cpp_fused_a_0 = async_compile.cpp_pybinding(['float*', 'const float*'], r\'\'\'
void kernel(float* in_out_ptr0, const float* in_ptr0) {}
\'\'\')

class Runner:
    def call(self, args):
        buf0 = empty_strided_cpu((4, ), (1, ), torch.float32)
        # [Provenance debug handles] cpp_fused_a_0:1
        cpp_fused_a_0(buf0, arg0_1)
        buf1 = buf0; del buf0  # reuse
        torch.ops.aten.index_put_(buf3, [arg1_1], buf1, True)
        # [Provenance debug handles] extern_kernels.mm:2
        extern_kernels.mm(buf1, arg0_1, out=buf2)
        # [Provenance debug handles] cpp_fused_a_0:3
        cpp_fused_a_0(buf2, buf1)
        return (buf2, )
'''


def test_kernel_calls_know_what_each_call_writes_and_what_other_lines_mutate():
    from jointlab.analysis.kernel_probe import kernel_calls, unprobed_writes

    calls = kernel_calls(_WRAPPER)
    # C++ kernels write their non-const pointers, extern calls their out=
    assert [(c.kernel, c.writes) for c in calls] == [
        ("cpp_fused_a_0:1", ("buf0",)), ("extern_kernels.mm:2", ("buf2",)),
        ("cpp_fused_a_0:3", ("buf2",))]
    # a call without a provenance handle may mutate what it is given: never compared
    assert unprobed_writes(_WRAPPER, calls) == {"buf1", "buf3"}
