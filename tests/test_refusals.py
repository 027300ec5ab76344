"""Refusals of train_fn misuse, compiled modules and raw torch errors.

Each case asserts the jointlab error class, the message (what, the user's
source line, what to do) and that the model is bitwise unchanged.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import jointlab as jl
from jointlab import errors
from tests.fixtures import zoo
from tests.util import assert_unchanged, deep_state

HERE = "test_refusals.py"
MODES = ["make_fx", "aot"]


def _mlp_with_grads():
    f = zoo.get("mlp")
    model = f.make_model()
    for p in model.parameters():  # a pre-existing grad, so an optimizer step would move p
        p.grad = torch.full_like(p, 0.5)
    return f, model, f.make_inputs(4)


def _refused(model, exc, fn, inputs, mode, *snippets):
    before = deep_state(model)
    joint = None
    with pytest.raises(exc) as info:
        joint = jl.trace(model, fn, inputs, mode=mode)
    assert joint is None  # no graph came back
    assert isinstance(info.value, errors.JointlabError)
    msg = str(info.value)
    for s in snippets:
        assert s in msg, (s, msg)
    assert_unchanged(before, model)
    return info.value


# -- optimizer steps and parameter writes -------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_optimizer_step_in_train_fn_is_refused_and_nothing_written(mode):
    f, model, inputs = _mlp_with_grads()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def train_fn(m, x, y):
        loss = f.train_fn(m, x, y)
        opt.step()
        return loss

    _refused(model, errors.TrainFnMisuseError, train_fn, inputs, mode,
             "SGD.step()", HERE, "opt.step()", "accumulate=True")
    assert not opt.state  # not even the momentum buffers were created


def _add(p):
    p.add_(1.0)


def _data_mul(p):
    p.data.mul_(2.0)


def _view_add(p):
    p[0].add_(1.0)


def _out_arg(p):
    torch.add(p, 1.0, out=p)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("write", [_add, _data_mul, _view_add, _out_arg])
def test_in_place_write_to_parameter_is_refused(mode, write):
    f, model, inputs = _mlp_with_grads()
    name = next(n for n, _ in model.named_parameters())
    owner, _, leaf = name.rpartition(".")

    def train_fn(m, x, y):
        with torch.no_grad():  # attribute access: AOT swaps in non-Parameter tensors
            write(getattr(m.get_submodule(owner), leaf))
        return f.train_fn(m, x, y)

    _refused(model, errors.TrainFnMisuseError, train_fn, inputs, mode,
             f"parameter '{name}'", HERE, "Move parameter updates")


@pytest.mark.parametrize("mode", MODES)
def test_write_to_real_parameter_held_outside_is_refused(mode):
    # The optimizer case without the optimizer hook: train_fn holds the real tensors.
    f, model, inputs = _mlp_with_grads()
    real = list(model.parameters())

    def train_fn(m, x, y):
        loss = f.train_fn(m, x, y)
        with torch.no_grad():
            for p in real:
                p.mul_(0.9)
        return loss

    _refused(model, errors.TrainFnMisuseError, train_fn, inputs, mode,
             "writes in place into parameter", "p.mul_(0.9)")


@pytest.mark.parametrize("mode", MODES)
def test_buffer_updates_still_trace(mode):
    f = zoo.get("cnn_bn")
    model, inputs = f.make_model(), f.make_inputs(4)
    before = deep_state(model)
    joint = jl.trace(model, f.train_fn, inputs, mode=mode)
    assert_unchanged(before, model)
    mean = model.bn1.running_mean.clone()
    joint.run(model, inputs)
    assert not torch.equal(model.bn1.running_mean, mean)  # BatchNorm stats were updated


# -- the user's own backward ----------------------------------------------------------
def _backward(loss, m):
    loss.backward()


def _autograd_backward(loss, m):
    torch.autograd.backward(loss)


def _autograd_grad(loss, m):
    torch.autograd.grad(loss, list(m.parameters()), retain_graph=True)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("call,name,line", [
    (_backward, "loss.backward()", "loss.backward()"),
    (_autograd_backward, "torch.autograd.backward()", "torch.autograd.backward(loss)"),
    (_autograd_grad, "torch.autograd.grad()", "torch.autograd.grad(loss, list("),
])
def test_backward_in_train_fn_is_refused(mode, call, name, line):
    f, model, inputs = _mlp_with_grads()

    def train_fn(m, x, y):
        loss = f.train_fn(m, x, y)
        call(loss, m)
        return loss

    _refused(model, errors.TrainFnMisuseError, train_fn, inputs, mode,
             f"train_fn called {name}", HERE, line, "return the loss")


# -- gradients read inside train_fn (issue #27 item 5) ------------------------------------
def _clip(m):
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)


def _zero_grad(m):
    m.zero_grad()


def _read_grad(m):
    return [p.grad for p in m.parameters()]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("touch,access,line", [
    (_clip, "reads", "torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)"),
    (_zero_grad, "reads", "m.zero_grad()"),
    (_read_grad, "reads", "return [p.grad for p in m.parameters()]"),
])
def test_grad_access_in_train_fn_is_refused_with_how_to_clip(mode, touch, access, line):
    # The model already has .grad: make_fx used to bake those stale values into the graph
    # (and joint.save then failed on them); AOT read None, so clipping silently did nothing.
    f, model, inputs = _mlp_with_grads()
    first = next(n for n, _ in model.named_parameters())

    def train_fn(m, x, y):
        loss = f.train_fn(m, x, y)
        touch(m)
        return loss

    _refused(model, errors.TrainFnMisuseError, train_fn, inputs, mode,
             f"train_fn {access} the .grad of parameter '{first}'", HERE, line,
             "accumulate=True); torch.nn.utils.clip_grad_norm_(model.parameters()")


# -- meta models and compiled modules --------------------------------------------------
def _op_counts(joint):
    counts: dict[str, int] = {}
    for n in joint.graph.nodes:
        if n.op == "call_function":
            counts[str(n.target)] = counts.get(str(n.target), 0) + 1
    return counts


def test_meta_model_traces_in_aot_mode_and_run_refuses():
    f = zoo.get("mlp")
    inputs = f.make_inputs(4)
    meta = zoo.make_meta_mlp()
    before = [(n, t, t.device) for n, t in meta.state_dict(keep_vars=True).items()]
    joint = jl.trace(meta, f.train_fn, inputs, mode="aot")  # deep_state cannot read meta
    assert before == [(n, t, t.device) for n, t in meta.state_dict(keep_vars=True).items()]
    real = jl.trace(f.make_model(), f.train_fn, inputs, mode="aot")
    assert _op_counts(joint) == _op_counts(real)  # the same graph as for real weights
    assert joint.param_names == real.param_names
    with pytest.raises(errors.MetaDeviceError, match="meta device"):
        joint.run(meta, inputs)


def _compile_block(model, calls):
    model.fc1 = torch.compile(model.fc1, backend=lambda gm, ex: calls.append(gm) or gm)


def _compile_whole(model, calls):
    model.compile(backend=lambda gm, ex: calls.append(gm) or gm)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("compile_, where", [(_compile_block, "'fc1'"),
                                             (_compile_whole, "'<the model>'")])
def test_compiled_module_is_refused_before_compiling(mode, compile_, where):
    f = zoo.get("mlp")
    model, inputs = f.make_model(), f.make_inputs(4)
    calls: list = []
    compile_(model, calls)
    _refused(model, errors.CompiledModuleError, f.train_fn, inputs, mode,
             where, "compiled with torch.compile", "_orig_mod", "joint.compile()")
    assert calls == []  # refused before dynamo compiled anything


# -- raw errors ------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_user_exception_keeps_its_type_and_is_chained(mode):
    f, model, inputs = _mlp_with_grads()

    def train_fn(m, x, y):
        f.train_fn(m, x, y)
        raise ValueError("my own check failed")

    err = _refused(model, ValueError, train_fn, inputs, mode,
                   "train_fn raised ValueError: my own check failed", HERE,
                   'raise ValueError("my own check failed")')
    assert isinstance(err, errors.TrainFnError)
    assert type(err.__cause__) is ValueError and str(err.__cause__) == "my own check failed"


@pytest.mark.parametrize("mode", MODES)
def test_raw_torch_error_is_wrapped_with_user_line(mode):
    f, model, inputs = _mlp_with_grads()

    def train_fn(m, x, y):
        return F.mse_loss(m(x[:, :3]), y)  # wrong feature size

    # The innermost user frame is the model's forward, where the shapes clash.
    err = _refused(model, errors.TraceError, train_fn, inputs, mode,
                   "jl.trace failed inside torch", "zoo.py", "self.fc1(x)", "mode=")
    assert not isinstance(err, errors.TrainFnError)
    assert isinstance(err.__cause__, RuntimeError)
    assert not isinstance(err.__cause__, errors.JointlabError)


def test_raw_torch_error_while_running_names_the_graph_node():
    f = zoo.get("mlp")
    model, inputs = f.make_model(), f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs)
    # A bad edit: the first addmm gets its operands swapped, so the shapes clash at run.
    node = next(n for n in joint.graph.nodes if n.target == torch.ops.aten.addmm.default)
    node.args = (node.args[0], node.args[2], node.args[1])
    joint.graph_module.recompile()
    before = deep_state(model)
    with pytest.raises(errors.NodeExecutionError) as info:
        joint.run(model, inputs)
    msg = str(info.value)
    assert "joint.run failed inside torch" in msg and "at graph node:" in msg
    assert f"{node.name} = torch.ops.aten.addmm.default(" in msg
    assert isinstance(info.value.__cause__, RuntimeError)
    assert not isinstance(info.value.__cause__, errors.JointlabError)
    assert_unchanged(before, model)


def test_compare_wraps_user_and_torch_errors():
    f = zoo.get("mlp")
    model, inputs = f.make_model(), f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs)

    def raises(m, x, y):
        raise KeyError("eager only")

    def bad_shape(m, x, y):
        return F.mse_loss(m(x[:, :3]), y)

    before = deep_state(model)
    with pytest.raises(KeyError) as info:
        jl.compare(joint, model, inputs, train_fn=raises)
    assert isinstance(info.value, errors.TrainFnError)
    assert "train_fn raised KeyError" in str(info.value) and "during jl.compare" in str(info.value)
    with pytest.raises(errors.TraceError, match="jl.compare failed inside torch") as info:
        jl.compare(joint, model, inputs, train_fn=bad_shape)
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(TypeError, match="compare needs the training step"):  # jointlab's own
        joint.train_fn = None
        jl.compare(joint, model, inputs)
    assert_unchanged(before, model)
