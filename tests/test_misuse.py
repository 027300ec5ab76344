"""Misuse corpus: every wrong call raises a jointlab error that names the problem.

Each case asserts the error class, the message content, and that the model
is bitwise unchanged (values, grads, requires_grad, training flags, tensor
and module identity, global RNG).
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab import errors
from tests.util import assert_unchanged, deep_state, node_values

HERE = "test_misuse.py"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(F.relu(self.bn(self.fc1(x))))


def make_net():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = Net().train()
    net.fc1.weight.grad = torch.full_like(net.fc1.weight, 0.25)  # a pre-existing grad
    return net


def mse(model, x, y):
    return F.mse_loss(model(x), y)


def inputs(batch=4):
    g = torch.Generator().manual_seed(1)
    return {"x": torch.randn(batch, 4, generator=g), "y": torch.randn(batch, 2, generator=g)}


def expect(exc_type, pattern, fn, model):
    before = deep_state(model)
    with pytest.raises(exc_type, match=pattern) as info:
        fn()
    assert isinstance(info.value, errors.JointlabError)
    assert_unchanged(before, model)
    return info.value


# -- trace-time errors ---------------------------------------------------------------
def test_non_tensor_leaf_names_type_and_path():
    net = make_net()
    bad = {**inputs(), "aux": {"table": [np.zeros(3)]}}
    expect(errors.InputTypeError, r"'aux\.table\.0'.*numpy\.ndarray",
           lambda: jl.trace(net, lambda m, x, y, aux: mse(m, x, y), bad), net)


def test_module_among_inputs():
    net, extra = make_net(), nn.Linear(2, 2)
    expect(errors.InputTypeError, r"'extra' is an nn\.Module \(Linear\)",
           lambda: jl.trace(net, lambda m, x, y, extra: mse(m, x, y),
                            {**inputs(), "extra": extra}), net)


def test_non_scalar_loss():
    net = make_net()
    expect(errors.LossError, r"shape \[4, 2\].*must be a scalar",
           lambda: jl.trace(net, lambda m, x, y: (m(x) - y) ** 2, inputs()), net)


def test_python_number_loss():
    net = make_net()
    expect(errors.LossError, r"returned a float as the loss",
           lambda: jl.trace(net, lambda m, x, y: 1.5, inputs()), net)


def test_loss_without_grad():
    net = make_net()
    expect(errors.LossError, r"does not require grad",
           lambda: jl.trace(net, lambda m, x, y: m(x).detach().sum(), inputs()), net)


def test_no_trainable_parameters():
    net = make_net()
    for p in net.parameters():
        p.requires_grad_(False)
    expect(errors.NoTrainableParametersError, r"Net has no parameter with requires_grad=True",
           lambda: jl.trace(net, mse, inputs()), net)


def _branchy(model, x, y):
    out = model(x)
    if out.sum() > 0:  # data-dependent branch
        out = out * 2
    return F.mse_loss(out, y)


def _item(model, x, y):
    scale = model(x).abs().max().item()  # reads a value
    return F.mse_loss(model(x) / scale, y)


@pytest.mark.parametrize("fn,line", [(_branchy, "if out.sum() > 0"),
                                     (_item, "scale = model(x).abs().max().item()")])
def test_data_dependent_python_shows_user_line(fn, line):
    net = make_net()
    err = expect(errors.DataDependentError, "reads a tensor's value",
                 lambda: jl.trace(net, fn, inputs()), net)
    assert HERE in str(err) and line in str(err)


def _printing(model, x, y):
    out = model(x)
    print("activations:", out)
    return F.mse_loss(out, y)


def test_printing_a_tensor_while_tracing_is_an_error():
    net = make_net()
    # jl.trace must enter its own printing guard: nothing here enters it for it.
    err = expect(errors.DataDependentError, "prints or formats a tensor",
                 lambda: jl.trace(net, _printing, inputs()), net)
    assert HERE in str(err) and 'print("activations:", out)' in str(err)
    assert "DataDependentError" not in repr(torch.ones(1))  # printing works again afterwards


def test_user_exception_mid_trace_surfaces_and_model_unchanged():
    net = make_net()

    def boom(model, x, y):
        model(x)
        raise KeyError("user bug")

    before = deep_state(net)
    with pytest.raises(KeyError, match="user bug"):
        jl.trace(net, boom, inputs())
    assert_unchanged(before, net)


# -- run-time errors -----------------------------------------------------------------
@pytest.fixture
def traced():
    net = make_net()
    return net, jl.trace(net, mse, inputs())


def _run_cases():
    x, y = inputs()["x"], inputs()["y"]
    return {
        "list_instead_of_tensor": (errors.InputStructureError, r"missing: x; unexpected: x\.0",
                                   {"x": x.tolist(), "y": y}),
        "number_instead_of_tensor": (errors.InputTypeError, r"input 'y'.*got float",
                                     {"x": x, "y": 0.5}),
        "numpy_leaf": (errors.InputTypeError, r"'x'.*numpy\.ndarray", {"x": x.numpy(), "y": y}),
        "batch_size": (errors.InputMismatchError, r"'x'.*dim 0: expected 4, got 5",
                       inputs(5)),
        "feature_size": (errors.InputMismatchError, r"'x'.*dim 1: expected 4, got 3",
                         {"x": x[:, :3], "y": y}),
        "rank": (errors.InputMismatchError, r"'y' has rank 3", {"x": x, "y": y[None]}),
        "dtype": (errors.InputMismatchError, r"'x' has dtype torch\.float64.*torch\.float32",
                  {"x": x.double(), "y": y}),
        "device_meta": (errors.InputMismatchError, r"'y' is on meta.*traced for cpu",
                        {"x": x, "y": y.to("meta")}),
        "missing_key": (errors.InputStructureError, r"missing: y", {"x": x}),
        "extra_key": (errors.InputStructureError, r"unexpected: z", {"x": x, "y": y, "z": y}),
        "not_a_dict": (errors.InputTypeError, r"inputs must be a dict", [x, y]),
    }


@pytest.mark.parametrize("case", sorted(_run_cases()))
def test_wrong_inputs_at_run(case, traced):
    net, joint = traced
    exc, pattern, bad = _run_cases()[case]
    expect(exc, pattern, lambda: joint.run(net, bad), net)


@pytest.mark.parametrize("case", ["batch_size", "dtype", "device_meta", "missing_key"])
def test_wrong_inputs_in_stepper(case, traced):
    net, joint = traced
    exc, pattern, bad = _run_cases()[case]
    expect(exc, pattern, lambda: jl.Stepper(joint, net, bad, device="cpu"), net)


def test_changed_python_constant_at_run():
    net = make_net()

    def scaled(model, x, y, w):
        return mse(model, x, y) * w

    joint = jl.trace(net, scaled, {**inputs(), "w": 2.0})
    expect(errors.InputMismatchError, r"'w' was baked into the graph as 2\.0.*got 3\.0",
           lambda: joint.run(net, {**inputs(), "w": 3.0}), net)


def _add_layer(net):
    net.extra = nn.Linear(2, 2)


def _resize_layer(net):
    net.fc2 = nn.Linear(8, 3)


def _drop_buffer(net):
    del net.bn.running_mean
    net.bn.register_buffer("running_mean", None)


@pytest.mark.parametrize("edit,pattern", [
    (_add_layer, r"unexpected \['extra\.weight', 'extra\.bias'\]"),
    (_resize_layer, r"'fc2\.weight' is now \[3, 8\].*traced as \[2, 8\]"),
    (lambda n: n.double(), r"'fc1\.weight' is now \[8, 4\] torch\.float64"),
    (_drop_buffer, r"missing \['bn\.running_mean'\]"),
    (lambda n: n.to("meta"), r"'fc1\.weight' is on the meta device"),
])
def test_model_edited_after_tracing(edit, pattern, traced):
    net, joint = traced
    edit(net)
    expect(errors.JointlabError, pattern, lambda: joint.run(net, inputs()), net)


# -- non-finite values -----------------------------------------------------------------
class Exploding(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(torch.exp(self.fc(x)))


def _first_non_finite(joint, net, inp):
    """Independent reference: run the plain fx.Interpreter and scan values in order."""
    values = node_values(joint, net, inp)
    placeholders = {n.name for n in joint.graph.nodes if n.op == "placeholder"}
    for name, v in values.items():
        if name in placeholders:  # given, not produced
            continue
        ts = [v] if isinstance(v, torch.Tensor) else [t for t in v if isinstance(t, torch.Tensor)] \
            if isinstance(v, (list, tuple)) else []
        if any(t.is_floating_point() and not torch.isfinite(t).all() for t in ts):
            return name
    return None


@pytest.mark.parametrize("poison", ["nan_input", "inf_input", "overflow"])
def test_non_finite_inputs_run_and_stepper_finds_first_node(poison):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = Exploding()
    x = torch.randn(3, 4)
    joint = jl.trace(net, lambda m, x: m(x).mean(), {"x": x})
    if poison == "nan_input":
        x[1, 2] = float("nan")
    elif poison == "inf_input":
        x[0, 0] = float("inf")
    else:
        x = x * 1e4  # finite input; exp overflows inside the graph
    before = deep_state(net)
    loss, grads, _ = joint.run(net, {"x": x})  # allowed: no error
    eager = net(x).mean()
    torch.testing.assert_close(loss, eager.detach(), equal_nan=True)
    assert_unchanged(before, net)

    want = _first_non_finite(joint, net, {"x": x})
    assert want is not None
    stepper = jl.Stepper(joint, net, {"x": x}, device="cpu")
    stepper.add_breakpoint(when="non-finite")
    assert stepper.run() is None
    assert stepper.hit is not None and stepper.hit[1].name == want
    if poison == "overflow":  # the inputs are finite: the first culprit is the exp
        assert "exp" in str(stepper.hit[1].target)
    else:  # the first op that reads the poisoned input
        assert stepper.hit[1].target == torch.ops.aten.addmm.default
    assert_unchanged(before, net)


# -- Python state captured in closures ------------------------------------------------
SCALE = 0.37


def _global_scaled(model, x, y):
    return mse(model, x, y) * SCALE


class ClosureNet(nn.Module):
    def __init__(self, gain):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.gain = gain

    def forward(self, x):
        return self.fc(x) * self.gain * SCALE


def _baked(records) -> list[str]:
    """The BakedConstantWarning messages among recorded warnings."""
    return [str(w.message) for w in records if issubclass(w.category, errors.BakedConstantWarning)]


def test_closure_float_is_warned_as_baked():
    net = make_net()
    temperature = 1.7

    def train_fn(model, x, y):
        return mse(model, x, y) / temperature

    with pytest.warns(errors.BakedConstantWarning, match=r"train_fn: temperature = 1\.7") as rec:
        joint = jl.trace(net, train_fn, inputs())
    assert len(_baked(rec)) == 1
    # ... and it really is baked: changing it changes eager, and the graph (which would
    # still compute with 1.7) refuses instead of answering wrongly.
    loss_before, _, _ = joint.run(net, inputs())
    temperature = 3.0  # noqa: F841 - rebinding the closure cell on purpose
    assert not torch.allclose(train_fn(make_net(), **inputs()), loss_before)
    with pytest.raises(errors.AssumptionError, match=r"train_fn: temperature was 1\.7 when "
                                                     r"traced and is 3\.0 now"):
        joint.run(make_net(), inputs())


def test_global_and_forward_constants_are_warned():
    net = make_net()
    with pytest.warns(errors.BakedConstantWarning, match=r"train_fn: SCALE = 0\.37"):
        jl.trace(net, _global_scaled, inputs())
    with torch.random.fork_rng(devices=[]):
        cnet = ClosureNet(gain=2.5)
    with pytest.warns(errors.BakedConstantWarning, match=r"ClosureNet\.forward: SCALE = 0\.37"):
        jl.trace(cnet, mse, inputs())


HEADS = 2  # a module-level int used as a shape: it cannot be passed as a tensor or buffer
OFFSET = 3  # the same kind of int used as a value: passing it as a tensor would work


class _ShapeNet(nn.Module):
    def __init__(self, value_int: bool) -> None:
        super().__init__()
        self.fc, self.value_int = nn.Linear(4, 4), value_int

    def forward(self, x):
        h = self.fc(x).view(x.shape[0], HEADS, 4 // HEADS).flatten(1)
        return h + OFFSET if self.value_int else h


@pytest.mark.parametrize("value_int", [False, True])
def test_ints_are_warned_only_where_they_could_be_tensors(value_int):
    net = _ShapeNet(value_int)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        jl.trace(net, mse, {"x": x, "y": y})
    found = _baked(rec)
    # Reference: HEADS only sizes a view; OFFSET is added to the values.
    assert not any("HEADS" in m for m in found)
    assert any("_ShapeNet.forward: OFFSET = 3" in m for m in found) == value_int


def test_captured_tensor_is_warned_as_baked():
    net = make_net()
    offset = torch.tensor([0.5, -0.5])

    def train_fn(model, x, y):
        return F.mse_loss(model(x) + offset, y)

    with pytest.warns(errors.BakedConstantWarning, match=re.escape("tensor[2] torch.float32")):
        jl.trace(net, train_fn, inputs())


def test_no_warning_without_captured_state():
    net = make_net()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        jl.trace(net, mse, inputs())
    assert _baked(rec) == []
