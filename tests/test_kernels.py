"""Inductor kernels mapped onto the joint graph, and compiled compares with a float64 reference.

One Inductor compile of the zoo's two-layer GPT (tiny_lm) serves the module.
"""

from __future__ import annotations

import copy

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


def _max_abs(a: torch.Tensor, ref: torch.Tensor) -> float:
    return (a.double() - ref).abs().max().item()


def _eager(model, train_fn, inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Plain eager autograd from seed 0: the loss and every parameter's gradient."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        loss = train_fn(model, **inputs)
        names, params = zip(*model.named_parameters())
        grads = torch.autograd.grad(loss, params)
    return loss.detach(), dict(zip(names, grads))


def test_fp64_verdict_says_who_is_really_closer(tiny_compiled):
    """Recompute each value's distance to float64 eager with plain autograd, and check
    ``closer`` names the side really nearer (an inverted verdict fails here)."""
    f, model, inputs, joint, compiled, cmp = tiny_compiled
    with one_thread():
        e_loss, e_grads = _eager(copy.deepcopy(model), f.train_fn, inputs)
        r_loss, r_grads = _eager(copy.deepcopy(model).double(), f.train_fn, inputs)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            c_loss, c_grads, _ = compiled.run(copy.deepcopy(model), inputs)
    mine = {"loss": (c_loss, e_loss, r_loss)}
    mine.update({k: (c_grads[k], e_grads[k], r_grads[k]) for k in c_grads})
    decisive = 0
    for row in cmp.fp64.itertuples():
        cand, eager, ref = mine[row.name]
        c_err, e_err = _max_abs(cand, ref), _max_abs(eager, ref)
        assert row.candidate_vs_fp64 == pytest.approx(c_err, rel=1e-6, abs=1e-12), row
        assert row.eager_vs_fp64 == pytest.approx(e_err, rel=1e-6, abs=1e-12), row
        if max(c_err, e_err) > 1.5 * min(c_err, e_err):  # clearly one side
            decisive += 1
            assert row.closer == ("inductor" if c_err < e_err else "eager"), row
    assert decisive >= 3, cmp.fp64


def test_kernel_table_covers_matmuls_with_extern_calls(tiny_compiled):
    *_, joint, compiled, _ = tiny_compiled
    tab = K.kernel_table(compiled)
    assert list(tab.columns) == ["name", "kind", "nodes", "modules", "phase", "copies", "source"]
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
    assert cov.share >= 0.99  # measured 96/96
    col = K.kernel_column(compiled)
    assert all(col[n] == "" for n in cov.unmapped)
    assert all(col[n.name] for n in compute if n.name not in cov.unmapped)


def _independent_compute(joint):
    """Non-view ATen calls that allocate nothing uninitialised, from the op schemas alone."""
    return [n.name for n in joint.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and not n.target.is_view
            and n.target.overloadpacket.__name__ not in K.ALLOCATIONS | K.RESHAPES]


def test_coverage_matches_an_independent_count_from_inductors_raw_mapping(tiny_compiled):
    *_, joint, compiled, _ = tiny_compiled
    cov = compiled.coverage()
    compute = _independent_compute(joint)
    prov = compiled.compiled.provenance
    in_kernels = {post for posts in prov["cppCodeToPost"].values() for post in posts}
    covered = [n for n in compute
               if in_kernels & set(prov["preToPost"].get(n, ()))]
    assert cov.compute == len(compute) and cov.covered == len(covered)
    assert len(covered) / len(compute) >= 0.99, set(compute) - set(covered)
    # the summary reports the share: the kernel table's attrs and the compiled repr
    tab = compiled.kernels()
    assert tab.attrs["coverage"] == cov
    assert f"({cov.share:.1%}) mapped" in repr(compiled)


def test_tied_weight_gradient_mm_is_covered_by_the_addmm_that_absorbed_it(tiny_compiled):
    *_, joint, compiled, _ = tiny_compiled
    # lm_head's weight is the embedding's: its gradient mm is added to the embedding
    # gradient, and Inductor's mm + add -> addmm replacement consumes the mm
    tied = [n for n in joint.graph.nodes if n.target is torch.ops.aten.mm.default
            and jl.meta.module(n) == "lm_head" and jl.meta.phase(n) == "backward"]
    col = K.kernel_column(compiled)
    assert tied and all(col[n.name] for n in tied), [n.name for n in tied]
    code = compiled.compiled.source_code
    for n in tied:
        for kernel in col[n.name].split(", "):
            assert kernel.startswith(("extern_kernels.mm", "extern_kernels.addmm")), kernel
            assert f"[Provenance debug handles] {kernel}\n" in code, kernel


def test_kernel_layer_colours_the_dag_by_the_kernel_table(tiny_compiled):
    *_, joint, compiled, _ = tiny_compiled
    layer = compiled.kernel_layer()
    tab = K.kernel_table(compiled)
    assert set(layer) == {n for nodes in tab["nodes"] for n in nodes}
    for kernel, row in tab.iterrows():
        assert all(kernel in layer[n].split(", ") for n in row["nodes"]), kernel
    # every node listed under a label is in exactly the kernels that label names
    for node, label in layer.items():
        assert {k for k, row in tab.iterrows() if node in row["nodes"]} == set(label.split(", "))
    from jointlab.viz import dagview

    payload = dagview.build_payload(joint, layers={"kernel": layer}, color_by="kernel")
    lay = payload["layers"]["kernel"]
    assert lay["kind"] == "cat" and set(lay["levels"]) == set(layer.values())
    for n, code in zip(joint.graph.nodes, lay["v"]):
        assert code == (lay["levels"].index(layer[n.name]) if n.name in layer else -1), n.name
    view = jl.dag_view(joint, layers={"kernel": layer}, color_by="kernel")
    assert "extern_kernels.addmm" in view.html()



def _rgb(hex_color):
    return "rgb({}, {}, {})".format(*(int(hex_color[i:i + 2], 16) for i in (1, 3, 5)))


def test_kernel_legend_is_capped_short_below_the_graph_with_full_names(tiny_compiled, tmp_path):
    from collections import Counter

    from jointlab.viz import _legend
    from tests.chromium import PageErrors, browser, chromium_path, dag_state

    *_, joint, compiled, _ = tiny_compiled
    layer = compiled.kernel_layer()
    counts = Counter(layer.values())  # nodes per label, counted here, not by the view
    assert len(counts) > _legend.LEGEND_LEVELS and max(map(len, counts)) > 100
    chromium_path()
    path = jl.dag_view(joint, layers={"kernel": layer}, color_by="kernel",
                       height=600).write_html(tmp_path / "kernels.html")
    with browser() as b:
        page = b.new_page(viewport={"width": 1000, "height": 720})
        errors = PageErrors(page)
        page.goto(path.as_uri())
        page.wait_for_function("() => { const d = document.querySelector('.jl-dag');"
                               " return d && d.jlView && d.jlView.lastFrameMs !== undefined }")
        dag_state(page)
        entries = page.evaluate("""() => [...document.querySelectorAll('.jl-legend span')]
            .filter(s => s.querySelector('i')).map(s => ({text: s.textContent, title: s.title,
             bg: getComputedStyle(s.querySelector('i')).backgroundColor}))""")
        boxes = page.evaluate("""() => { const q = s => document.querySelector(s)
            .getBoundingClientRect().toJSON(); return {dag: q('.jl-dag'),
            canvas: q('.jl-canvas'), legend: q('.jl-legend')}; }""")
        kernels = [e for e in entries if e["title"] in counts]
        # capped: the most frequent labels, each under its full name as the tooltip
        assert len(kernels) == _legend.LEGEND_LEVELS
        least_shown = min(counts[e["title"]] for e in kernels)
        assert all(n <= least_shown for k, n in counts.items()
                   if k not in {e["title"] for e in kernels})
        more = [e for e in entries if e["text"].startswith("+")]
        assert [e["text"] for e in more] == [f"+{len(counts) - len(kernels)} more kernels"]
        assert all(len(e["text"]) <= _legend.LABEL_MAX for e in entries), entries
        assert len({e["bg"] for e in kernels}) == len(kernels)  # one colour per entry
        # a node of the top kernel is drawn in its entry's colour
        top = kernels[0]
        node = next(n for n, k in layer.items() if k == top["title"])
        color = page.evaluate(f"() => {{ const v = document.querySelector('.jl-dag').jlView;"
                              f" return v.nodeColor(v.P.nodes.name.indexOf({node!r})); }}")
        assert _rgb(color) == top["bg"]
        # the legend sits below the graph, which keeps most of the view
        assert boxes["legend"]["top"] >= boxes["canvas"]["bottom"] - 0.5
        assert boxes["canvas"]["height"] >= 0.6 * boxes["dag"]["height"], boxes
        # the node's detail panel names its kernels in full
        longest = max(layer, key=lambda n: len(layer[n]))
        page.evaluate(f"() => {{ const v = document.querySelector('.jl-dag').jlView;"
                      f" v.select(v.P.nodes.name.indexOf({longest!r}), true); }}")
        assert page.locator(".jl-detail .jl-layer").text_content() == layer[longest]
        assert errors.errors == [], errors.errors

def test_no_kernel_map_without_inductor_provenance():
    f = zoo.FIXTURES["mlp"]
    model, inputs = f.make_model(), f.make_inputs(4)
    compiled = jl.trace(model, f.train_fn, inputs).compile("aot_eager")
    with pytest.raises(CompiledGraphError, match="backend='aot_eager'"):
        K.kernel_table(compiled)
    not_run = jl.trace(model, f.train_fn, inputs).compile("inductor")
    with pytest.raises(CompiledGraphError, match="has not run yet"):
        K.kernel_coverage(not_run)
