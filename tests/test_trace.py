"""The make_fx tracer and JointGraph.run against eager autograd."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import jointlab as jl
from jointlab import errors
from jointlab.meta import KEY, TRAIN_FN
from tests.fixtures import zoo
from tests.util import assert_unchanged, deep_state, eager_step

NAMES = [n for n in zoo.FIXTURES]


def _trace(name, **kw):
    f = zoo.get(name)
    model = f.make_model()
    inputs = f.make_inputs(4)
    return f, model, inputs, jl.trace(model, f.train_fn, inputs, **kw)


@pytest.mark.parametrize("name", NAMES)
def test_run_matches_eager_over_two_steps(name):
    f, model, inputs, joint = _trace(name)
    ref = f.make_model()
    for step in range(2):
        torch.manual_seed(100 + step)
        loss, grads, ld = joint.run(model, inputs)
        eloss, egrads, eld = eager_step(ref, f.train_fn, inputs, seed=100 + step)
        torch.testing.assert_close(loss, eloss, rtol=0, atol=0)
        assert list(grads) == joint.param_names == list(egrads)
        for k in grads:
            torch.testing.assert_close(grads[k], egrads[k], rtol=1e-6, atol=1e-7)
        assert list(ld) == list(eld) == joint.loss_dict_keys
        for k in ld:
            torch.testing.assert_close(ld[k], eld[k])
        for (k, a), (k2, b) in zip(model.named_buffers(), ref.named_buffers()):
            assert k == k2
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_graph_layout_mlp():
    f, model, inputs, joint = _trace("mlp")
    ph = joint.placeholders
    assert [n.meta[KEY]["fqn"] for n in ph[: joint.num_state_inputs]] == joint.state_fqns
    assert joint.state_fqns == [n for n, _ in model.named_parameters()]
    assert not [n for n in joint.graph.nodes if n.op == "get_attr"]
    out = list(joint.graph.output_node().args[0])
    assert len(out) == 1 + len(joint.param_names) + len(joint.loss_dict_keys)
    for name, (p, g) in joint.params_and_grads().items():
        assert p.meta[KEY]["fqn"] == name and g is out[1 + joint.param_names.index(name)]


def test_tied_weights_one_placeholder_full_gradient():
    f, model, inputs, joint = _trace("tiny_lm")
    assert "lm_head.weight" not in joint.state_fqns and "wte.weight" in joint.state_fqns
    assert joint.num_state_inputs == len(dict(model.named_parameters()))
    torch.manual_seed(0)
    _, grads, _ = joint.run(model, inputs)
    _, egrads, _ = eager_step(f.make_model(), f.train_fn, inputs, seed=0)
    torch.testing.assert_close(grads["wte.weight"], egrads["wte.weight"])


def test_unused_parameter_gets_zero_gradient_and_no_grad_node():
    f, model, inputs, joint = _trace("unused_param")
    _, grads, _ = joint.run(model, inputs)
    unused = [n for n in joint.param_names if n.startswith("unused.")]
    assert unused
    for n in unused:
        assert torch.count_nonzero(grads[n]) == 0 and grads[n].shape == model.get_parameter(n).shape
        assert joint.params_and_grads()[n][1] is None
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and not set(frozen) & set(joint.param_names)


def test_phases_and_module_attribution_tiny_lm():
    f, model, inputs, joint = _trace("tiny_lm")
    nodes = list(joint.graph.nodes)
    phases = [n.meta[KEY]["phase"] for n in nodes]
    assert set(phases) <= {"param", "buffer", "input", "forward", "backward", "output"}
    # a forward value never depends on a backward value
    for n in nodes:
        if n.meta[KEY]["phase"] == "forward":
            assert all(a.meta[KEY]["phase"] != "backward" for a in n.all_input_nodes), n
    # every engine-tagged node is backward, and every backward node has a module
    assert all(n.meta[KEY]["phase"] == "backward" for n in nodes if n.meta.get("autograd_backward"))
    bwd = [n for n in nodes if n.meta[KEY]["phase"] == "backward"]
    # root-module ops have FQN "" and the root's type; loss ops belong to train_fn
    assert bwd and all(n.meta[KEY]["module_type"] or n.meta[KEY]["module"] == TRAIN_FN
                       for n in bwd)
    # saved-tensor detaches and multi-output getitems made during forward are forward
    for n in nodes:
        if n.target in (torch.ops.aten.detach.default,) and not n.meta.get("autograd_backward"):
            assert n.meta[KEY]["phase"] == "forward", n
    named = [n for n in bwd if n.meta[KEY]["module"] != TRAIN_FN]
    assert len(named) / len(bwd) > 0.9
    # backward nodes carry their forward twin's module, stack and source
    for n in bwd:
        twin = n.meta[KEY].get("fwd_twin")
        if twin:
            t = next(x for x in nodes if x.name == twin)
            assert t.meta[KEY]["module"] == n.meta[KEY]["module"]
            assert t.meta["seq_nr"] == n.meta["seq_nr"]
            assert n.meta.get("nn_module_stack") == t.meta.get("nn_module_stack")
    mods = {n.meta[KEY]["module"] for n in bwd}
    assert {"h.0.attn.qkv", "h.1.mlp.0", "ln_f"} <= mods
    # the loss itself belongs to the training function; attention ops keep a source line
    ce = [n for n in nodes if "nll_loss_forward" in str(n.target)]
    assert ce and ce[0].meta[KEY]["module"] == TRAIN_FN
    assert ce[0].meta[KEY]["source"].startswith("models.py:")


def test_batchnorm_structure_is_forward():
    _, _, _, joint = _trace("cnn_bn")
    for n in joint.graph.nodes:
        if n.op == "call_function" and n.args and getattr(n.args[0], "target", None) == \
                torch.ops.aten.native_batch_norm.default:
            assert n.meta[KEY]["phase"] == "forward"
            assert n.meta[KEY]["module"].startswith("bn")


def test_meta_model_traces_but_run_refuses():
    model = zoo.make_meta_mlp()
    f = zoo.get("mlp")
    inputs = f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs)
    assert any(n.meta[KEY]["phase"] == "backward" for n in joint.graph.nodes)
    assert all(p.device.type == "meta" for p in model.parameters())
    with pytest.raises(errors.MetaDeviceError, match="meta device"):
        joint.run(model, inputs)


def test_accumulate_matches_backward_twice():
    f, model, inputs, joint = _trace("mlp")
    ref = f.make_model()
    for _ in range(2):
        joint.run(model, inputs, accumulate=True)
        f.train_fn(ref, **inputs).backward()
    for (_n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_tracing_leaves_model_unchanged_incl_shared_submodule():
    for name in ("shared_submodule", "cnn_bn", "tiny_lm"):
        f = zoo.get(name)
        model = f.make_model()
        for p in list(model.parameters())[:2]:
            p.grad = torch.ones_like(p)
        before = deep_state(model)
        jl.trace(model, f.train_fn, f.make_inputs(4))
        assert_unchanged(before, model)
        assert all(not isinstance(p, torch._subclasses.FakeTensor) for p in model.parameters())


def test_train_fn_raising_surfaces_and_model_unchanged():
    f = zoo.get("shared_submodule")
    model = f.make_model()
    before = deep_state(model)

    class Boom(Exception):
        pass

    def bad(model, **kw):
        model(kw["x"])
        raise Boom("user failure")

    with pytest.raises(Boom, match="user failure"):
        jl.trace(model, bad, f.make_inputs(4))
    assert_unchanged(before, model)


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_no_sample_input_storage_kept_alive(mode):
    f = zoo.get("mlp")
    model = f.make_model()
    inputs = f.make_inputs(4)
    refs = [weakref.ref(v) for v in inputs.values()]
    joint = jl.trace(model, f.train_fn, inputs, dynamic=True, mode=mode)
    del inputs
    gc.collect()
    assert all(r() is None for r in refs)
    assert joint.run(model, f.make_inputs(4))[0].ndim == 0


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_tied_weight_gradient_is_never_one_term_passed_off_as_the_whole(mode):
    f = zoo.FIXTURES["tiny_lm"]
    model, inputs = f.make_model(), f.make_inputs(2)
    joint = jl.trace(model, f.train_fn, inputs, mode=mode)
    _, egrads, _ = eager_step(f.make_model(), f.train_fn, inputs, seed=0)
    runner = jl.Stepper(joint, f.make_model(), inputs, keep="all", seed=0)
    runner.run()
    terms = joint.grad_terms()["wte.weight"]
    total = sum(runner.value(t) for t in terms)
    torch.testing.assert_close(total, egrads["wte.weight"])  # the terms add up to eager's
    entry = joint.params_and_grads()["wte.weight"][1]
    if len(terms) == 1:  # make_fx sums the tied uses in the graph
        assert mode == "make_fx" and entry is terms[0]
    else:  # AOT: one term per alias, none of which is the gradient
        assert mode == "aot" and entry == terms
        assert not any(torch.allclose(runner.value(t), egrads["wte.weight"]) for t in terms)
