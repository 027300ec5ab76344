"""Dynamic shapes: one trace serves other sizes exactly; guards reject the rest."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import jointlab as jl
from jointlab import errors
from tests.fixtures import zoo
from tests.util import eager_step


def _lm(**kw):
    f = zoo.get("tiny_lm")
    model = f.make_model()
    return f, model, jl.trace(model, f.train_fn, f.make_inputs(4), **kw)


def _ids(b, t, dtype=torch.long, seed=0):
    gen = torch.Generator().manual_seed(seed * 1000 + b)
    return torch.randint(0, 64, (b, t), dtype=dtype, generator=gen)


@pytest.mark.parametrize("kw", [{"dynamic": True},
                                {"dynamic_arg_dims": {"input_ids": [0, -1], "labels": [0, 1]}}])
def test_dynamic_trace_serves_other_sizes_exactly(kw):
    f, model, joint = _lm(**kw)
    ref = f.make_model()
    for b, t in [(2, 8), (3, 5), (7, 8)]:
        inputs = {"input_ids": _ids(b, t), "labels": _ids(b, t, seed=1)}
        torch.manual_seed(1)
        loss, grads, _ = joint.run(model, inputs)
        eloss, egrads, _ = eager_step(ref, f.train_fn, inputs, seed=1)
        torch.testing.assert_close(loss, eloss, rtol=0, atol=0)
        for k in grads:
            torch.testing.assert_close(grads[k], egrads[k], rtol=1e-6, atol=1e-7)


def test_parameters_stay_static():
    _, _, joint = _lm(dynamic=True)
    for n in joint.placeholders[: joint.num_state_inputs]:
        assert all(isinstance(s, int) for s in n.meta["val"].shape)


def test_selected_dims_only():
    f, model, joint = _lm(dynamic_arg_dims={"input_ids": 0, "labels": 0})
    ok = {"input_ids": _ids(3, 8), "labels": _ids(3, 8, seed=1)}
    joint.run(model, ok)
    with pytest.raises(errors.InputMismatchError, match=r"dim 1: expected 8, got 5"):
        joint.run(model, {"input_ids": _ids(3, 5), "labels": _ids(3, 5)})


def test_guard_rejects_rank_and_dtype():
    _, model, joint = _lm(dynamic=True)
    with pytest.raises(errors.InputMismatchError, match="'input_ids' has rank 3"):
        joint.run(model, {"input_ids": _ids(2, 8)[..., None], "labels": _ids(2, 8)})
    with pytest.raises(errors.InputMismatchError, match="'input_ids' has dtype torch.int32"):
        joint.run(model, {"input_ids": _ids(2, 8, torch.int32), "labels": _ids(2, 8)})


def test_guard_rejects_zero_one_specialization():
    _, model, joint = _lm(dynamic=True)
    msg = r"dim 0 of 'input_ids' is 1.*specializes sizes 0 and 1"
    with pytest.raises(errors.GuardError, match=msg):
        joint.run(model, {"input_ids": _ids(1, 8), "labels": _ids(1, 8)})


def test_dim_traced_as_one_is_specialized():
    f = zoo.get("mlp")
    model = f.make_model()
    joint = jl.trace(model, f.train_fn, f.make_inputs(1), dynamic=True)
    with pytest.raises(errors.GuardError, match="specialized to 1 at trace time"):
        joint.run(model, f.make_inputs(3))


def test_guard_rejects_size_mismatch_between_unified_dims():
    _, model, joint = _lm(dynamic=True)
    with pytest.raises(errors.GuardError, match="'labels'") as info:
        joint.run(model, {"input_ids": _ids(2, 8), "labels": _ids(3, 8)})
    assert "'input_ids'" in str(info.value)


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if x.shape[0] > 4:  # a shape branch taken at trace time
            return self.lin(x).sum()
        return self.lin(x).mean()


def test_guard_rejects_other_branch_and_names_source_line():
    model = Branchy()
    joint = jl.trace(model, lambda m, x: m(x), {"x": torch.randn(6, 4)}, dynamic_arg_dims={"x": 0})
    with pytest.raises(errors.GuardError, match=r"dim 0 of 'x'.*3") as info:
        joint.run(model, {"x": torch.randn(3, 4)})
    assert "test_dynamic.py:" in str(info.value) and "if x.shape[0] > 4" in str(info.value)
    loss, grads, _ = joint.run(model, {"x": torch.ones(9, 4)})
    torch.testing.assert_close(loss, model(torch.ones(9, 4)))


def test_bad_dynamic_arg_dims():
    f = zoo.get("mlp")
    model = f.make_model()
    with pytest.raises(errors.InputStructureError, match="'nope'"):
        jl.trace(model, f.train_fn, f.make_inputs(4), dynamic_arg_dims={"nope": 0})
    with pytest.raises(errors.InputStructureError, match="rank 2"):
        jl.trace(model, f.train_fn, f.make_inputs(4), dynamic_arg_dims={"x": 5})


def test_static_trace_refuses_other_batch_size():
    f = zoo.get("mlp")
    model = f.make_model()
    joint = jl.trace(model, f.train_fn, f.make_inputs(4))
    with pytest.raises(errors.InputMismatchError, match=r"dim 0: expected 4, got 6.*dynamic=True"):
        joint.run(model, f.make_inputs(6))
