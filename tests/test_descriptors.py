"""Descriptor-style queries on both modes.

References: in ``aot`` mode, PyTorch's own ``fx_utils`` helpers over the
descriptors; in both modes, the values the graph actually computes compared
with eager autograd (a gradient node must hold that parameter's gradient).
"""

from __future__ import annotations

import pytest
import torch
from torch._functorch._aot_autograd import fx_utils

from jointlab.meta import KEY
from tests.util import eager_step, node_values, traced_fixture

MODES = ("make_fx", "aot")


@pytest.mark.parametrize("mode", MODES)
def test_unused_param_names_counts_and_grads(mode):
    f, inputs, joint = traced_fixture("unused_param", mode)
    model = f.make_model()
    names = [n for n, _ in model.named_parameters()]
    assert list(joint.params()) == names  # frozen_scale included
    assert joint.buffers() == {}
    pairs = joint.inputs_and_grads()
    assert len(pairs) == len(names) + 2  # + x, y
    by_fqn = {ph.meta[KEY].get("fqn", ph.meta[KEY].get("input_path")): g for ph, g in pairs}
    for none in ("unused.weight", "unused.bias", "frozen_scale", "x", "y"):
        assert by_fqn[none] is None, none
    values = node_values(joint, model, inputs, seed=0)
    _, egrads, _ = eager_step(f.make_model(), f.train_fn, inputs, seed=0)
    for fqn in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
        g = by_fqn[fqn]
        assert g is not None and g in joint.graph.output_node().all_input_nodes
        torch.testing.assert_close(values[g.name], egrads[fqn], rtol=1e-6, atol=1e-7)
    (loss, tangent), = joint.outputs_and_tangents()
    eloss = eager_step(f.make_model(), f.train_fn, inputs, seed=0)[0]
    torch.testing.assert_close(values[loss.name], eloss)
    assert (tangent is None) == (mode == "make_fx")


@pytest.mark.parametrize("mode", MODES)
def test_buffers_and_loss_dict_outputs(mode):
    _, _, bn = traced_fixture("cnn_bn", mode)
    assert list(bn.buffers()) == bn.buffer_names
    assert all(n.meta[KEY]["phase"] == "buffer" for n in bn.buffers().values())
    assert all(g is None for ph, g in bn.inputs_and_grads() if ph.meta[KEY]["phase"] == "buffer")
    f, inputs, nested = traced_fixture("nested_inputs", mode)
    outs = nested.outputs_and_tangents()
    assert len(outs) == 1 + len(nested.loss_dict_keys)
    values = node_values(nested, f.make_model(), inputs, seed=0)
    eloss, _, eld = eager_step(f.make_model(), f.train_fn, inputs, seed=0)
    torch.testing.assert_close(values[outs[0][0].name], eloss)
    for (node, tangent), key in zip(outs[1:], nested.loss_dict_keys):
        assert tangent is None
        torch.testing.assert_close(values[node.name], eld[key])


def test_aot_queries_agree_with_torch_fx_utils():
    for name in ("tiny_lm", "cnn_bn", "unused_param"):
        _, _, joint = traced_fixture(name, "aot")
        g = joint.graph
        ref = fx_utils.get_all_input_and_grad_nodes(g)
        ours = joint.inputs_and_grads()
        plain = {d: pair for d, pair in ref.items()
                 if type(d).__name__ != "TangentAOTInput"}
        assert ours == list(plain.values())
        ref_out = fx_utils.get_plain_output_and_tangent_nodes(g)
        assert joint.outputs_and_tangents() == list(ref_out.values())
        assert list(joint.params()) == [k.removeprefix("model.")
                                        for k in fx_utils.get_named_param_nodes(g)]
        assert list(joint.params().values()) == list(fx_utils.get_named_param_nodes(g).values())
        assert list(joint.buffers().values()) == fx_utils.get_buffer_nodes(g)


def test_modes_agree_on_names_and_grad_presence():
    for name in ("tiny_lm", "unused_param", "cnn_bn"):
        a, m = traced_fixture(name, "aot")[2], traced_fixture(name, "make_fx")[2]
        assert set(m.params()) <= set(a.params())  # aot adds tied aliases
        extra = set(a.params()) - set(m.params())
        assert extra == ({"lm_head.weight"} if name == "tiny_lm" else set())
        assert list(a.buffers()) == list(m.buffers())

        def has_grad(joint):
            return {ph.meta[KEY]["fqn"] for ph, g in joint.inputs_and_grads()
                    if g is not None and ph.meta[KEY]["phase"] == "param"}

        assert has_grad(a) - extra == has_grad(m)


def test_tables_descriptors_and_memory_import_neither_the_graph_nor_a_renderer():
    """Readers annotate with jointlab.core.TracedGraph; HTML only through the display registry."""
    import ast
    import pathlib

    import jointlab

    root = pathlib.Path(jointlab.__file__).parent / "analysis"
    files = [root / "tables.py", root.parent / "runtime" / "descriptors.py",
             *sorted((root / "memory").glob("*.py"))]
    handoffs = []
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                node.module or ""]
            for name in names:
                assert name != "jointlab.graph", f"{path.name} imports jointlab.graph"
                if name.startswith(("jointlab.viz", "jointlab.widgets")):
                    handoffs.append(f"{path.name}: {name}")
    # Results ask jointlab.display.render for a view (jointlab.renderers registers the
    # renderers): no reader imports viz/ or widgets/, not even in _repr_html_.
    assert handoffs == []
