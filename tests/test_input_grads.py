"""Input gradients and inputs that are parameters (issue 40, item 7), against eager autograd.

The reference is eager's own ``x.grad`` / ``p.grad`` after ``loss.backward()`` on a
deepcopy of the model, with inputs that are that copy's parameters where the graph's are
the model's.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.errors import InputMismatchError, InputTypeError
from tests.util import assert_same_bits

MODES = ["make_fx", "aot"]


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def mse(model, x, y):
    return F.mse_loss(model(x), y)


def nested(model, batch, scale):
    return F.mse_loss(model(batch["x"]) * scale, batch["y"])


def with_weight(model, x, y, w):
    return F.mse_loss(model(x), y) + (w ** 2).sum() * 0.1


def _inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(5, 8, generator=g).requires_grad_(),
            "y": torch.randn(5, 4, generator=g)}


def _eager(model, train_fn, inputs, swap=None):
    """``loss.backward()`` on a deepcopy: (loss, p.grad by FQN, x.grad by path)."""
    m = copy.deepcopy(model)
    inp = {k: (v.detach().clone().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor)
               else v) for k, v in inputs.items()}
    if swap:
        inp.update({k: m.get_parameter(fqn) for k, fqn in swap.items()})
    loss = train_fn(m, **inp)
    loss.backward()
    grads = {n: p.grad for n, p in m.named_parameters()}
    leaves = {k: v.grad for k, v in inp.items() if isinstance(v, torch.Tensor) and v.requires_grad}
    return loss.detach(), grads, leaves


@pytest.mark.parametrize("mode", MODES)
def test_run_returns_input_gradient_as_eager(mode):
    model, inputs = _mlp(), _inputs()
    joint = jl.trace(model, mse, inputs, mode=mode)
    result = joint.run(model, inputs)
    loss, grads, loss_dict = result  # still three names
    want_loss, want_grads, want_in = _eager(model, mse, inputs)
    assert_same_bits(loss, want_loss, "loss")
    assert_same_bits(grads, want_grads, "grads")
    assert list(result.input_grads) == ["x"]
    assert_same_bits(result.input_grads, want_in, "input_grads")
    assert loss_dict == {}
    # the gradient is a backward node, paired with its input by the descriptor query
    pairs = {n.meta["jointlab"].get("input_path"): g for n, g in joint.inputs_and_grads()}
    assert pairs["y"] is None and pairs["x"] is not None
    assert pairs["x"].meta["jointlab"]["phase"] == "backward"
    assert pairs["x"].meta["jointlab"]["input_grad_of"] == "x"


@pytest.mark.parametrize("mode", MODES)
def test_nested_input_path_and_loss_dict(mode):
    model = _mlp()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 8, generator=g).requires_grad_()
    scale = torch.tensor(1.5, requires_grad=True)
    inputs = {"batch": {"x": x, "y": torch.randn(3, 4, generator=g)}, "scale": scale}

    def fn(model, batch, scale):
        loss = nested(model, batch, scale)
        return loss, {"half": loss.detach() / 2}

    joint = jl.trace(model, fn, inputs, mode=mode)
    result = joint.run(model, inputs)
    m = copy.deepcopy(model)
    xe, se = x.detach().clone().requires_grad_(), scale.detach().clone().requires_grad_()
    loss = nested(m, {"x": xe, "y": inputs["batch"]["y"]}, se)
    loss.backward()
    assert list(result.input_grads) == ["batch.x", "scale"]
    assert_same_bits(result.input_grads, {"batch.x": xe.grad, "scale": se.grad}, "input_grads")
    assert_same_bits(result.loss_dict["half"], loss.detach() / 2, "loss_dict")


@pytest.mark.parametrize("mode", MODES)
def test_stepper_record_and_accumulate(mode):
    model, inputs = _mlp(), _inputs()
    joint = jl.trace(model, mse, inputs, mode=mode)
    _, _, want_in = _eager(model, mse, inputs)
    stepped = jl.Stepper(joint, model, inputs).run()
    assert_same_bits(stepped.input_grads, want_in, "Stepper input_grads")
    rec = jl.record(joint, model, inputs)
    norm = float(torch.linalg.vector_norm(want_in["x"]))
    assert rec.input_grad_norms["x"] == pytest.approx(norm, rel=1e-6)
    assert "input x" in rec.gradients.values()


@pytest.mark.parametrize("mode", MODES)
def test_compare_judges_and_names_the_input_gradient(mode):
    model, inputs = _mlp(), _inputs()
    joint = jl.trace(model, mse, inputs, mode=mode)
    comp = jl.compare(joint, model, inputs)
    assert comp.verdict == "bit-exact"
    assert list(comp.input_grads["name"]) == ["x"] and comp.input_grads["exact"].all()
    # scale the input-gradient output by 1.001: compare must name that input
    g = next(g for n, g in joint.inputs_and_grads() if g is not None
             and n.meta["jointlab"]["phase"] == "input")
    with joint.graph.inserting_after(g):
        scaled = joint.graph.call_function(torch.ops.aten.mul.Tensor, (g, 1.001))
    scaled.meta["jointlab"] = dict(g.meta["jointlab"])
    joint.graph.output_node().replace_input_with(g, scaled)
    joint.recompute()
    comp = jl.compare(joint, model, inputs)
    assert comp.verdict == "MISMATCH"
    assert not comp.input_grads["ok"].any() and comp.grads["ok"].all()
    assert comp.first_divergence.what == "input gradient"
    assert "gradient of input 'x'" in str(comp.first_divergence)


@pytest.mark.parametrize("mode", MODES)
def test_save_load_keeps_input_gradients(mode, tmp_path):
    model, inputs = _mlp(), _inputs()
    joint = jl.trace(model, mse, inputs, mode=mode)
    path = tmp_path / "g.jlg"
    joint.save(path)
    loaded = jl.load(path)
    _, _, want_in = _eager(model, mse, inputs)
    assert_same_bits(loaded.run(model, inputs).input_grads, want_in, "loaded input_grads")
    pairs = {n.meta["jointlab"].get("input_path"): g for n, g in loaded.inputs_and_grads()}
    assert pairs["x"] is not None and pairs["y"] is None
    with pytest.raises(InputMismatchError, match="requires_grad"):
        loaded.run(model, {**inputs, "x": inputs["x"].detach()})


@pytest.mark.parametrize("mode", MODES)
def test_requires_grad_differing_from_trace_is_refused(mode):
    model, inputs = _mlp(), _inputs()
    joint = jl.trace(model, mse, inputs, mode=mode)
    with pytest.raises(InputMismatchError, match=r"input 'x' has requires_grad=False.*traced "
                       r"with requires_grad=True"):
        joint.run(model, {**inputs, "x": inputs["x"].detach()})
    plain = jl.trace(model, mse, {**inputs, "x": inputs["x"].detach()}, mode=mode)
    assert plain.run(model, {**inputs, "x": inputs["x"].detach()}).input_grads == {}
    with pytest.raises(InputMismatchError, match=r"input 'x' has requires_grad=True"):
        plain.run(model, inputs)
    with pytest.raises(InputMismatchError, match="requires_grad"):
        jl.Stepper(joint, model, {**inputs, "x": inputs["x"].detach()})


@pytest.mark.parametrize("mode", MODES)
def test_parameter_as_input_gets_eagers_gradient(mode):
    model = _mlp()
    inputs = {**_inputs(), "w": model[0].weight}
    inputs["x"] = inputs["x"].detach()
    joint = jl.trace(model, with_weight, inputs, mode=mode)
    result = joint.run(model, inputs)
    want_loss, want_grads, _ = _eager(model, with_weight, inputs, swap={"w": "0.weight"})
    assert_same_bits(result.loss, want_loss, "loss")
    assert_same_bits(result.grads, want_grads, "grads")  # both uses of 0.weight summed
    assert_same_bits(result.input_grads, {"w": want_grads["0.weight"]}, "w.grad is p.grad")
    assert jl.compare(joint, model, inputs).verdict == "bit-exact"
    # traced as the parameter: another tensor there is refused (and the other way round)
    other = model[0].weight.detach().clone().requires_grad_()
    with pytest.raises(InputMismatchError, match=r"input 'w' was traced as the model's "
                       r"'0.weight' but is now a tensor of its own"):
        joint.run(model, {**inputs, "w": other})
    apart = jl.trace(model, with_weight, {**inputs, "w": other}, mode=mode)
    with pytest.raises(InputMismatchError, match=r"traced as a tensor of its own but is now "
                       r"the model's '0.weight'"):
        apart.run(model, inputs)


@pytest.mark.parametrize("mode", MODES)
def test_same_tensor_twice_sums_like_eager(mode):
    model = _mlp()
    x = _inputs()["x"]

    def twice(model, a, b):
        return (model(a) * model(b).detach() + model(b)).sum()

    joint = jl.trace(model, twice, {"a": x, "b": x}, mode=mode)
    result = joint.run(model, {"a": x, "b": x})
    m, xe = copy.deepcopy(model), x.detach().clone().requires_grad_()
    twice(m, xe, xe).backward()
    assert_same_bits(result.input_grads, {"a": xe.grad, "b": xe.grad}, "input_grads")
    assert_same_bits(result.grads, {n: p.grad for n, p in m.named_parameters()}, "grads")
    # without grad, two inputs stay two placeholders (a make_fx trace once read one for both)
    xd = x.detach()
    plain = jl.trace(model, twice, {"a": xd, "b": xd}, mode=mode)
    b = torch.randn(5, 8)
    got = plain.run(model, {"a": xd, "b": b}).loss
    assert_same_bits(got, twice(model, xd, b).detach(), "loss with another b")


def test_input_computed_from_a_parameter_is_refused():
    model = _mlp()
    inputs = {**_inputs(), "w": model[0].weight * 1.0}
    with pytest.raises(InputTypeError, match=r"input 'w' was computed from the parameter "
                       r"'0.weight'"):
        jl.trace(model, with_weight, inputs)


@pytest.mark.parametrize("mode", MODES)
def test_dynamic_trace_returns_input_gradients(mode):
    model = _mlp()
    joint = jl.trace(model, mse, _inputs(), mode=mode, dynamic=True)
    g = torch.Generator().manual_seed(3)
    inputs = {"x": torch.randn(7, 8, generator=g).requires_grad_(),
              "y": torch.randn(7, 4, generator=g)}
    _, want_grads, want_in = _eager(model, mse, inputs)
    result = joint.run(model, inputs)
    assert_same_bits(result.input_grads, want_in, "input_grads")
    assert_same_bits(result.grads, want_grads, "grads")
