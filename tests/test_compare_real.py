"""compare() on models nobody here wrote: no false mismatch, and small planted bugs found.

The reference is eager autograd on a copy of the same model with the same
seed. The graphs of these families are bit-exact with eager, so a clean
graph must come out "bit-exact", and a bug as small as a x1.001 scale on one
backward matmul must come out MISMATCH, named by the module the value belongs to.
"""

from __future__ import annotations

import operator

import pytest
import torch

import jointlab as jl
from jointlab import meta as _meta
from tests.fixtures import real, zoo

aten = torch.ops.aten


def _traced(name: str, mode: str = "make_fx"):
    f = real.get(name)
    model, inputs = f.make_model(), f.make_inputs(2)
    return model, inputs, jl.trace(model, f.train_fn, inputs, mode=mode)


def _insert_after(joint, node, target, *args):
    """Rewire every user of ``node`` to ``target(node, *args)`` (annotated like ``node``)."""
    with joint.graph.inserting_after(node):
        new = joint.graph.call_function(target, (node, *args))
    node.replace_all_uses_with(new, delete_user_cb=lambda u: u is not new)
    new.meta["jointlab"] = dict(_meta.info(node))
    new.meta["val"] = node.meta.get("val")
    joint.recompute()
    return new


def _mismatch(joint, model, inputs):
    """compare() of an edited graph: it must say MISMATCH and name a first divergence."""
    c = jl.compare(joint, model, inputs)
    assert c.verdict == "MISMATCH" and not c.ok and c.first_divergence is not None, repr(c)
    return c


@pytest.mark.parametrize("name,mode", [("hf_llama", "make_fx"), ("resnet", "make_fx"),
                                       ("mobilenet_v3", "aot"), ("mobilenet_v3", "make_fx")])
def test_clean_graph_is_bit_exact(name, mode):
    # Llama: rotary (cos, sin) are two same-shape outputs of one module.
    # ResNet: ReLU(inplace=True) overwrites BatchNorm's output right after it.
    # MobileNetV3 in AOT: the avgpool gradient used to be paired with the wrong node.
    model, inputs, joint = _traced(name, mode)
    c = jl.compare(joint, model, inputs)
    assert c.verdict == "bit-exact" and c.ok and c.exact, repr(c)
    assert c.first_divergence is None and c.first_inexact is None and not c.unchecked


def test_rotary_outputs_are_told_apart():
    model, inputs, joint = _traced("hf_llama")
    probed = {tuple(k): n for n in joint.graph.nodes
              for k in _meta.info(n).get("probe_out", [])}
    cos, sin = probed[("model.rotary_emb", 0, 0)], probed[("model.rotary_emb", 0, 1)]
    assert cos is not sin
    s = jl.Stepper(joint, model, inputs, keep={cos.name, sin.name})
    s.run()
    pos = torch.arange(inputs["input_ids"].shape[1])[None]
    x = torch.zeros(1, 1, dtype=torch.float32)
    want_cos, want_sin = model.model.rotary_emb(x, pos)
    assert torch.equal(s.value(cos), want_cos) and torch.equal(s.value(sin), want_sin)


def test_rotary_bug_is_found_in_rotary_embedding():
    model, inputs, joint = _traced("hf_llama")
    sin = next(n for n in joint.graph.nodes if n.target == aten.sin.default)
    _insert_after(joint, sin, aten.mul.Tensor, 1.001)
    d = _mismatch(joint, model, inputs).first_divergence
    assert d.module == "model.rotary_emb" and d.what == "module output", str(d)


def test_in_place_bug_after_batch_norm_is_found():
    model, inputs, joint = _traced("resnet")
    add_ = next(n for n in joint.graph.nodes
                if n.target == aten.add_.Tensor and _meta.module(n) == "layer1.0")
    add_.target = aten.sub_.Tensor  # out += identity  ->  out -= identity
    joint.recompute()
    d = _mismatch(joint, model, inputs).first_divergence
    # bn2's own output is still right (kept as produced); what follows the write is not
    assert d.module in ("layer1.0", "layer1.0.relu") and d.phase == "forward", str(d)


def test_tiny_backward_scale_is_found_and_named():
    model, inputs, joint = _traced("hf_gpt2")
    weight = model.transformer.h[0].mlp.c_fc.weight
    mm = next(n for n in joint.graph.nodes
              if n.target == aten.mm.default and _meta.is_backward(n)
              and _meta.module(n) == "transformer.h.0.mlp.c_fc"
              and tuple(n.meta["val"].shape) == tuple(weight.shape))
    _insert_after(joint, mm, aten.mul.Tensor, 1.001)
    c = _mismatch(joint, model, inputs)
    bad = c.grads[~c.grads["ok"]]
    assert list(bad["name"]) == ["transformer.h.0.mlp.c_fc.weight"]
    d = c.first_divergence
    assert d.what == "parameter gradient" and d.module == "transformer.h.0.mlp.c_fc", str(d)


def test_gelu_constant_bug_is_found_in_the_activation():
    model, inputs, joint = _traced("hf_gpt2")
    consts = [n for n in joint.graph.nodes
              if n.op == "call_function" and _meta.module(n) == "transformer.h.1.mlp.act"
              and 0.044715 in n.args]
    assert consts, "gelu_new's constant not found in the graph"
    node = consts[0]
    node.args = tuple(0.045 if a == 0.044715 else a for a in node.args)
    joint.recompute()
    d = _mismatch(joint, model, inputs).first_divergence
    assert d.module == "transformer.h.1.mlp.act" and d.phase == "forward", str(d)


def test_output_gradient_names_the_module_it_belongs_to():
    # A bug on the gradient that reaches ln_2's output in block 0: the node
    # computing it lives in c_fc's backward, but the value belongs to ln_2.
    model, inputs, joint = _traced("hf_gpt2")
    grad_nodes = {tuple(k): n for n in joint.graph.nodes
                  for k in _meta.info(n).get("probe_grad", [])}
    g = grad_nodes[("transformer.h.0.ln_2", 0, 0)]
    _insert_after(joint, g, aten.mul.Tensor, 1.001)
    d = _mismatch(joint, model, inputs).first_divergence
    assert d.what == "output gradient" and d.module == "transformer.h.0.ln_2", str(d)


def test_kept_value_is_the_value_as_produced():
    # BatchNorm's output is overwritten by ReLU(inplace=True); the stepper's
    # kept value must be BatchNorm's own output, as eager's module returns it.
    model, inputs, joint = _traced("resnet")
    bn = next(n for n in joint.graph.nodes
              if ["bn1", 0, 0] in _meta.info(n).get("probe_out", []))
    assert bn.target is operator.getitem
    s = jl.Stepper(joint, model, inputs, keep={bn.name})
    s.run()
    eager = torch.nn.Sequential(model.conv1, model.bn1)
    m2 = __import__("copy").deepcopy(eager)
    assert torch.equal(s.value(bn), m2(inputs["images"]).detach())


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_saved_and_loaded_graph_compares_the_same(tmp_path, mode):
    model, inputs, joint = _traced("resnet", mode)
    path = tmp_path / "g.zip"
    joint.save(str(path))
    loaded = jl.load(str(path))
    before, after = jl.compare(joint, model, inputs), jl.compare(loaded, model, inputs,
                                                                 train_fn=joint.train_fn)
    assert before.verdict == after.verdict == "bit-exact", repr(after)
    assert loaded.outputs_and_tangents()[0][0].name == joint.outputs_and_tangents()[0][0].name


def _bf16_traced(name, mode):
    f = real.REAL.get(name) or zoo.get(name)
    model, inputs = f.make_model(), f.make_inputs(2)

    def step(m, **kw):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return f.train_fn(m, **kw)

    return model, inputs, jl.trace(model, step, inputs, mode=mode)


@pytest.mark.parametrize("name", ["tiny_lm", "hf_llama"])
def test_bf16_autocast_in_aot_is_judged_at_bf16(name):
    # AOT decomposes some ops: other kernels than eager's, so bf16 tolerances
    model, inputs, joint = _bf16_traced(name, "aot")
    c = jl.compare(joint, model, inputs)
    assert c.ok and c.verdict in ("bit-exact", "within tolerance"), repr(c)
    assert any("bfloat16" in n for n in c.notes)
    strict = jl.compare(joint, model, inputs, exact=True)
    assert strict.ok == strict.exact == c.exact


@pytest.mark.parametrize("name", ["tiny_lm", "hf_llama"])
def test_bf16_autocast_in_make_fx_is_held_bitwise(name):
    # make_fx records the casts and bf16 kernels eager runs: bitwise equal, so a
    # x1.001 bug (far inside bf16's tolerance) must be a MISMATCH, not "within tolerance"
    model, inputs, joint = _bf16_traced(name, "make_fx")
    c = jl.compare(joint, model, inputs)
    assert c.verdict == "bit-exact" and c.exact, repr(c)
    # a weight gradient's cast back to float32 (a x1.001 on bf16 values would round away)
    cast = next(n for n in joint.graph.nodes if n.target == aten._to_copy.default
                and _meta.is_backward(n) and n.meta["val"].dtype == torch.float32
                and n.args[0].meta["val"].dtype == torch.bfloat16)
    _insert_after(joint, cast, aten.mul.Tensor, 1.001)
    bad = _mismatch(joint, model, inputs)
    assert bad.first_divergence.phase == "backward", str(bad.first_divergence)


def test_order_dependent_ops_are_judged_by_tolerance():
    # Mixtral's experts accumulate with index_put(accumulate=True): two eager
    # runs already differ bitwise on CPU, so exactness cannot be demanded.
    f = real.get("hf_mixtral")
    model, inputs = f.make_model(), f.make_inputs(2)
    joint = jl.trace(model, f.train_fn, inputs)
    c = jl.compare(joint, model, inputs)
    assert c.ok, repr(c)
    assert any("index_put" in n and "not bitwise reproducible" in n for n in c.notes)
