"""The AOT tracing mode against eager autograd and against the make_fx mode."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._functorch._aot_autograd import descriptors as D
from torch._subclasses import FakeTensor
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import jointlab as jl
from jointlab import errors
from jointlab.meta import KEY, TRAIN_FN
from tests.fixtures import zoo
from tests.util import (
    assert_unchanged,
    deep_state,
    eager_step,
    traced_fixture,
)

NAMES = list(zoo.FIXTURES)


def _assert_step_equal(got, want, buffers_got, buffers_want):
    loss, grads, ld = got
    eloss, egrads, eld = want
    torch.testing.assert_close(loss, eloss, rtol=0, atol=0)
    assert list(grads) == list(egrads)
    for k in grads:
        torch.testing.assert_close(grads[k], egrads[k], rtol=1e-6, atol=1e-7, msg=k)
    assert list(ld) == list(eld)
    for k in ld:
        torch.testing.assert_close(ld[k], eld[k], rtol=0, atol=0)
    for (k, a), (k2, b) in zip(buffers_got, buffers_want, strict=True):
        assert k == k2
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)


@pytest.mark.parametrize("name", NAMES)
def test_zoo_matches_eager_over_two_steps(name):
    f, inputs, joint = traced_fixture(name, "aot")
    assert joint.mode == "aot"
    model, ref = f.make_model(), f.make_model()
    for step in range(2):
        torch.manual_seed(10 + step)
        got = joint.run(model, inputs)
        want = eager_step(ref, f.train_fn, inputs, seed=10 + step)
        _assert_step_equal(got, want, list(model.named_buffers()), list(ref.named_buffers()))
        assert list(got[1]) == joint.param_names


@pytest.mark.parametrize("name", NAMES)
def test_modes_agree(name):
    f, inputs, aot = traced_fixture(name, "aot")
    _, _, mfx = traced_fixture(name, "make_fx")
    assert aot.param_names == mfx.param_names
    assert aot.state_fqns == mfx.state_fqns
    assert aot.loss_dict_keys == mfx.loss_dict_keys
    with_grad = {k for k, (_, g) in mfx.params_and_grads().items() if g is not None}
    assert {k for k, (_, g) in aot.params_and_grads().items() if g is not None} == with_grad
    m1, m2 = f.make_model(), f.make_model()
    for step in range(2):
        torch.manual_seed(step)
        a = aot.run(m1, inputs)
        torch.manual_seed(step)
        b = mfx.run(m2, inputs)
        _assert_step_equal(a, b, list(m1.named_buffers()), list(m2.named_buffers()))


def test_batchnorm_buffers_updated_once_per_run():
    f, inputs, joint = traced_fixture("cnn_bn", "aot")
    muts = [d for d in joint.graph.output_node().meta["desc"]
            if isinstance(d, D.InputMutationAOTOutput)]
    assert len(muts) == 6  # running_mean, running_var, num_batches_tracked x 2
    model = f.make_model()
    before = model.bn1.running_mean.clone()
    joint.run(model, inputs)
    joint.run(model, inputs)
    assert model.bn1.num_batches_tracked.item() == 2
    assert not torch.equal(model.bn1.running_mean, before)


def test_tied_weights_one_input_per_alias_merged_grad():
    f, inputs, joint = traced_fixture("tiny_lm", "aot")
    model = f.make_model()
    assert model.lm_head.weight is model.wte.weight
    ph = joint.params()
    assert "lm_head.weight" in ph and "wte.weight" in ph
    assert "lm_head.weight" not in joint.param_names
    torch.manual_seed(3)
    _, grads, _ = joint.run(model, inputs)
    _, egrads, _ = eager_step(f.make_model(), f.train_fn, inputs, seed=3)
    torch.testing.assert_close(grads["wte.weight"], egrads["wte.weight"], rtol=1e-6, atol=1e-7)


def test_dropout_bitwise_and_seed_dependent():
    f, inputs, joint = traced_fixture("tiny_lm", "aot")
    assert any(n.target is torch.ops.aten.native_dropout.default for n in joint.graph.nodes)
    model = f.make_model()
    torch.manual_seed(0)
    a = joint.run(model, inputs)[0]
    torch.manual_seed(1)
    b = joint.run(model, inputs)[0]
    assert not torch.equal(a, b)
    assert torch.equal(a, eager_step(f.make_model(), f.train_fn, inputs, seed=0)[0])


def test_annotations_match_make_fx_keys_and_attribution_share():
    _, _, aot = traced_fixture("tiny_lm", "aot")
    _, _, mfx = traced_fixture("tiny_lm", "make_fx")
    for n in aot.graph.nodes:
        meta = n.meta[KEY]
        assert {"phase", "module", "module_type", "source"} <= meta.keys(), n
    tangent = [n for n in aot.placeholders if isinstance(n.meta["desc"], D.TangentAOTInput)]
    assert len(tangent) == 1 and tangent[0].meta[KEY]["phase"] == "backward"
    # Independent check of phases: whatever depends on the tangent is backward.
    reach = {tangent[0]}
    for n in aot.graph.nodes:
        if n.op == "call_function" and any(a in reach for a in n.all_input_nodes):
            reach.add(n)
            assert n.meta[KEY]["phase"] == "backward", n
    loss = aot.outputs_and_tangents()[0][0]
    assert loss.meta[KEY]["phase"] == "forward" and loss.meta[KEY]["module"] == TRAIN_FN

    def share(joint):
        comp = [n for n in joint.graph.nodes
                if n.op == "call_function" and n.meta[KEY]["phase"] in ("forward", "backward")]
        return sum(n.meta[KEY]["module"] != TRAIN_FN for n in comp) / len(comp)

    assert share(aot) >= 0.9
    assert abs(share(aot) - share(mfx)) < 0.03
    bwd = [n for n in aot.graph.nodes if n.op == "call_function" and n.meta[KEY]["phase"]
           == "backward"]
    twins = [n for n in bwd if "fwd_twin" in n.meta[KEY]]
    assert len(twins) / len(bwd) >= 0.95
    by_name = {n.name: n for n in aot.graph.nodes}
    for n in twins:
        twin = by_name[n.meta[KEY]["fwd_twin"]]
        assert twin.meta[KEY]["phase"] == "forward"
        assert twin.meta["seq_nr"] == n.meta["seq_nr"]
    modules = {n.meta[KEY]["module"] for n in aot.graph.nodes}
    assert {"h.0.attn.qkv", "h.1.mlp.0", "ln_f"} <= modules
    assert all(n.meta[KEY]["source"] for n in aot.graph.nodes if n.op == "call_function")
    grads = {n.meta[KEY]["grad_of"] for n in aot.graph.nodes if "grad_of" in n.meta[KEY]}
    assert grads == set(aot.param_names)


def test_tracing_leaves_model_unchanged_and_no_fake_leak():
    for name in ("shared_submodule", "cnn_bn"):
        f = zoo.get(name)
        model = f.make_model()
        before = deep_state(model)
        joint = jl.trace(model, f.train_fn, f.make_inputs(4), mode="aot")
        assert_unchanged(before, model)
        assert _get_current_dispatch_mode_stack() == []
        assert not any(isinstance(t, FakeTensor) for t in model.state_dict().values())
        for n in joint.placeholders:
            assert isinstance(n.meta["val"], FakeTensor)
        assert not [n for n in joint.graph.nodes if n.op == "get_attr"]
        torch.ones(2) @ torch.ones(2)  # eager works: no fake mode left active


def test_train_fn_raising_leaves_model_unchanged():
    f = zoo.get("cnn_bn")
    model = f.make_model()
    before = deep_state(model)

    def boom(model, images, labels):
        F.cross_entropy(model(images), labels)
        raise KeyError("boom from train_fn")

    with pytest.raises(KeyError, match="boom from train_fn"):
        jl.trace(model, boom, f.make_inputs(4), mode="aot")
    assert_unchanged(before, model)
    assert _get_current_dispatch_mode_stack() == []
    assert not any(h for m in model.modules() for h in (m._forward_hooks, m._forward_pre_hooks))

    def detached(model, images, labels):
        return F.cross_entropy(model(images), labels).detach()

    with pytest.raises(errors.LossError):
        jl.trace(model, detached, f.make_inputs(4), mode="aot")
    assert_unchanged(before, model)


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(x)


def test_duplicate_inputs_aliasing_outputs_and_input_mutation():
    def step(model, a, b, c):
        c.add_(1.0)  # eager mutates the caller's tensor; the graph must too
        loss = (model(a) * model(b)).sum() + c.sum()
        return loss, {"first": a[:, 0], "count": 3}

    torch.manual_seed(0)
    model = _Tiny()
    x = torch.randn(2, 3)
    mk = lambda: {"a": x, "b": x, "c": torch.zeros(2)}  # noqa: E731
    joint = jl.trace(model, step, mk(), mode="aot")
    inp, ref_inp = mk(), mk()
    loss, grads, ld = joint.run(model, inp)
    eloss, egrads, eld = eager_step(copy.deepcopy(model), step, ref_inp, seed=0)
    torch.testing.assert_close(loss, eloss)
    for k in grads:
        torch.testing.assert_close(grads[k], egrads[k])
    assert torch.equal(inp["c"], ref_inp["c"]) and inp["c"].sum().item() == 2.0
    assert ld["count"] == 3 and list(ld) == ["first", "count"]
    assert torch.equal(ld["first"], eld["first"])
    # like eager, the loss_dict value is a view of the input, not a copy
    assert ld["first"].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_dynamic_batch_runs_other_sizes_and_guards():
    f = zoo.get("mlp")
    model = f.make_model()
    joint = jl.trace(model, f.train_fn, f.make_inputs(4), mode="aot",
                     dynamic_arg_dims={"x": 0, "y": 0})
    for batch in (3, 7):
        inputs = f.make_inputs(batch)
        loss, grads, _ = joint.run(model, inputs)
        eloss, egrads, _ = eager_step(f.make_model(), f.train_fn, inputs, seed=0)
        torch.testing.assert_close(loss, eloss)
        for k in grads:
            torch.testing.assert_close(grads[k], egrads[k])
    bad = {"x": torch.randn(5, 16), "y": torch.randn(6, 4)}
    with pytest.raises(errors.GuardError):
        joint.run(model, bad)


def test_meta_model_traces_but_run_refuses():
    f = zoo.get("mlp")
    model = zoo.make_meta_mlp()
    joint = jl.trace(model, f.train_fn, f.make_inputs(4), mode="aot")
    assert all(n.meta["val"].device.type == "meta" for n in joint.placeholders)
    with pytest.raises(errors.MetaDeviceError):
        joint.run(model, f.make_inputs(4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["mlp", "cnn_bn"])
def test_cuda_matches_eager_over_two_steps(name):
    f = zoo.get(name)
    inputs = {k: v.cuda() for k, v in f.make_inputs(4).items()}
    model, ref = f.make_model().cuda(), f.make_model().cuda()
    joint = jl.trace(model, f.train_fn, inputs, mode="aot")
    for step in range(2):
        loss, grads, _ = joint.run(model, inputs)
        eloss, egrads, _ = eager_step(ref, f.train_fn, inputs, seed=step)
        torch.testing.assert_close(loss, eloss)
        for k in grads:
            torch.testing.assert_close(grads[k], egrads[k])
        for a, b in zip(model.buffers(), ref.buffers(), strict=True):
            torch.testing.assert_close(a, b)
