"""Every error the tracer and ``run`` raise: class, message, and an untouched model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import jointlab as jl
from jointlab import errors
from tests.fixtures import zoo
from tests.util import assert_unchanged, deep_state


def _mlp():
    f = zoo.get("mlp")
    return f, f.make_model(), f.make_inputs(4)


def _raises_unchanged(model, exc, match, fn, inputs):
    before = deep_state(model)
    with pytest.raises(exc, match=match):
        jl.trace(model, fn, inputs)
    assert_unchanged(before, model)


def test_non_tensor_leaf_names_type_and_path():
    f, model, inputs = _mlp()
    inputs = {"x": inputs["x"], "y": inputs["y"], "cfg": {"opts": [1, object()]}}
    _raises_unchanged(model, errors.InputTypeError, r"'cfg\.opts\.1'.*builtins\.object",
                      lambda m, x, y, cfg: f.train_fn(m, x, y), inputs)


def test_module_among_inputs():
    f, model, inputs = _mlp()
    inputs = {**inputs, "head": nn.Linear(2, 2)}
    _raises_unchanged(model, errors.InputTypeError, r"'head' is an nn\.Module \(Linear\)",
                      lambda m, x, y, head: f.train_fn(m, x, y), inputs)


def test_inputs_must_be_a_dict():
    f, model, inputs = _mlp()
    with pytest.raises(errors.InputTypeError, match="must be a dict"):
        jl.trace(model, f.train_fn, [inputs["x"], inputs["y"]])


@pytest.mark.parametrize("ret,match", [
    (lambda out: out, r"loss of shape \[4, 4\]"),
    (lambda out: 3.0, "returned a float"),
    (lambda out: out.sum().detach(), "does not require grad"),
])
def test_bad_loss(ret, match):
    f, model, inputs = _mlp()
    _raises_unchanged(model, errors.LossError, match, lambda m, x, y: ret(m(x)), inputs)


def test_no_trainable_parameters():
    f, model, inputs = _mlp()
    model.requires_grad_(False)
    _raises_unchanged(model, errors.NoTrainableParametersError, "requires_grad=True",
                      f.train_fn, inputs)


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        if h.sum() > 0:  # data-dependent control flow
            h = h * 2
        return h.mean()


def test_data_dependent_control_flow_shows_source_line():
    model = DataDependent()
    inputs = {"x": torch.randn(3, 4)}
    before = deep_state(model)
    with pytest.raises(errors.DataDependentError) as info:
        jl.trace(model, lambda m, x: m(x), inputs)
    msg = str(info.value)
    assert "reads a tensor's value" in msg and "test_trace_errors.py" in msg
    assert "if h.sum() > 0" in msg
    assert_unchanged(before, model)


def test_item_in_train_fn():
    f, model, inputs = _mlp()

    def train_fn(m, x, y):
        loss = f.train_fn(m, x, y)
        print("loss", loss.item())
        return loss

    _raises_unchanged(model, errors.DataDependentError, r"loss\.item\(\)", train_fn, inputs)


def test_bad_mode_and_dynamic_flag():
    f, model, inputs = _mlp()
    with pytest.raises(ValueError, match="mode must be one of"):
        jl.trace(model, f.train_fn, inputs, mode="eager")
    with pytest.raises(TypeError, match="dynamic must be a bool"):
        jl.trace(model, f.train_fn, inputs, dynamic="yes")


# -- run-time checks ------------------------------------------------------------
@pytest.fixture()
def traced():
    f, model, inputs = _mlp()
    return f, model, inputs, jl.trace(model, f.train_fn, inputs)


def test_run_state_names_differ(traced):
    f, model, inputs, joint = traced
    model.extra = nn.Linear(2, 2)
    with pytest.raises(errors.StateMismatchError, match=r"unexpected \['extra.weight'"):
        joint.run(model, inputs)


def test_run_state_shape_changed(traced):
    f, model, inputs, joint = traced
    name = joint.state_fqns[0]
    model.get_submodule(name.rpartition(".")[0]).weight = nn.Parameter(torch.zeros(3, 3))
    with pytest.raises(errors.StateMismatchError, match=f"'{name}' is now \\[3, 3\\]"):
        joint.run(model, inputs)


def test_run_missing_and_extra_keys(traced):
    f, model, inputs, joint = traced
    with pytest.raises(errors.InputStructureError, match="missing: y"):
        joint.run(model, {"x": inputs["x"]})
    with pytest.raises(errors.InputStructureError, match="unexpected: z"):
        joint.run(model, {**inputs, "z": inputs["x"]})


def test_run_shape_dtype_device(traced):
    f, model, inputs, joint = traced
    with pytest.raises(errors.InputMismatchError, match=r"'x' has shape \[5, 16\]"):
        joint.run(model, {**inputs, "x": torch.randn(5, 16)})
    with pytest.raises(errors.InputMismatchError, match=r"'y' has dtype torch.float64"):
        joint.run(model, {**inputs, "y": inputs["y"].double()})
    with pytest.raises(errors.InputMismatchError, match=r"'x' is on meta"):
        joint.run(model, {**inputs, "x": inputs["x"].to("meta")})


def test_run_constant_leaf_changed():
    f = zoo.get("nested_inputs")
    model = f.make_model()
    inputs = f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs)
    with pytest.raises(errors.InputMismatchError, match=r"'scale' was baked into the graph as 0.5"):
        joint.run(model, {**inputs, "scale": 0.25})


# -- where errors point (issue #27 item 7) ------------------------------------------------
def test_compare_error_names_the_users_call_and_advice_that_applies():
    f = zoo.get("mlp")
    model, inputs = f.make_model(), f.make_inputs(4)
    broken = {"now": False}  # a hook's own state: nothing the traced step reads

    def hook(m, grad_in, grad_out):
        return (grad_in[0][:1],) if broken["now"] else None

    model.fc2.register_full_backward_hook(hook)
    joint = jl.trace(model, f.train_fn, inputs)
    # after tracing, the hook starts returning a wrong-sized gradient, so eager fails
    # inside torch's autograd engine, where no frame of the user's code is on the stack
    broken["now"] = True
    with pytest.raises(errors.TraceError) as info:
        jl.compare(joint, model, inputs)  # the line the error names
    msg = str(info.value)
    assert "test_trace_errors.py" in msg and "jl.compare(joint, model, inputs)" in msg, msg
    assert "contextlib.py" not in msg and "other tracing mode" not in msg, msg
    assert "trace it again with jl.trace" in msg
    assert isinstance(info.value.__cause__, RuntimeError)


def _wav2vec2_specaugment():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Wav2Vec2Config(
        vocab_size=12, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2, layerdrop=0.0,
        mask_time_prob=0.5, mask_time_length=2, mask_feature_prob=0.0,
        do_stable_layer_norm=True, feat_extract_norm="layer")
    return transformers.Wav2Vec2ForCTC(cfg).train(), {"input_values": torch.randn(2, 400)}


def _ctc_logits_loss(model, input_values):
    return -model(input_values=input_values).logits.log_softmax(-1)[..., 1].mean()


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_specaugment_refusal_names_the_trace_call_and_keeps_python_rngs(mode):
    import random

    import numpy as np

    model, inputs = _wav2vec2_specaugment()
    np.random.seed(3)
    random.seed(3)
    before = deep_state(model)
    np_state, py_state = np.random.get_state(), random.getstate()
    with pytest.raises(errors.DataDependentError) as info:
        jl.trace(model, _ctc_logits_loss, inputs, mode=mode)  # the line the refusal names
    msg = str(info.value)
    assert "test_trace_errors.py" in msg and "jl.trace(model, _ctc_logits_loss" in msg, msg
    assert "<string>" not in msg and "boolean-mask indexing" in msg
    assert random.getstate() == py_state
    got = np.random.get_state()
    assert got[0] == np_state[0] and (got[1] == np_state[1]).all() and got[2:] == np_state[2:]
    assert_unchanged(before, model)


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_python_and_numpy_draws_are_refused_and_the_generators_kept(mode):
    import random
    import warnings

    import numpy as np

    f = zoo.get("mlp")
    model, inputs = f.make_model(), f.make_inputs(4)

    def jittered(m, x, y):  # draws from both generators while traced
        return f.train_fn(m, x, y) * (1.0 + 0.0 * random.random() * float(np.random.rand()))

    random.seed(5)
    np.random.seed(5)
    want_py, want_np = random.random(), np.random.rand()  # what the next draws must be
    random.seed(5)
    np.random.seed(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", errors.BakedConstantWarning)
        # the graph would keep the one draw; eager draws anew each step
        with pytest.raises(errors.UnsupportedRandomOpError,
                           match=r"drew from Python's random module and numpy\.random"):
            jl.trace(model, jittered, inputs, mode=mode)
    assert random.random() == want_py and np.random.rand() == want_np
