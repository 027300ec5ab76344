"""Random ops draw exactly what eager draws, in both modes, through joint.run and the Stepper.

Each op of :data:`OPS` is a one-parameter model, traced in both modes, and
checked bit for bit against eager autograd from the same seed; a second seed
must change eager's loss, so no op here is silently deterministic. What cannot
be exact is refused at trace time (an explicit ``torch.Generator``,
``Tensor.random_(from, to)``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.errors import UnsupportedRandomOpError
from jointlab.meta import draws_random
from tests.util import assert_unchanged, deep_state, eager_step, needs_torch

MODES = ["make_fx", "aot"]
SEED = 11
_RRELU = nn.RReLU(0.1, 0.4)

# One random op (or torch's composite that draws), applied to h = x * w.
OPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "bernoulli": lambda h: h * torch.bernoulli(torch.sigmoid(h)),
    "bernoulli_float_": lambda h: h * torch.ones_like(h).bernoulli_(0.3),
    "bernoulli_tensor_": lambda h: h * torch.ones_like(h).bernoulli_(torch.sigmoid(h).detach()),
    "normal_tensor_tensor": lambda h: h * torch.normal(h, torch.ones_like(h)),
    "normal_tensor_float": lambda h: h * torch.normal(h, 2.0),
    "normal_float_tensor": lambda h: h * torch.normal(1.0, h.abs() + 0.1),
    "normal_float_float": lambda h: h * torch.normal(0.0, 1.0, size=h.shape),
    "normal_": lambda h: h * torch.empty_like(h).normal_(1.0, 0.5),
    "uniform_": lambda h: h * torch.empty_like(h).uniform_(-1.0, 2.0),
    "rand": lambda h: h * torch.rand(h.shape),
    "rand_like": lambda h: h * torch.rand_like(h),
    "randn": lambda h: h * torch.randn(h.shape, dtype=torch.float64).float(),
    "randn_like": lambda h: h * torch.randn_like(h),
    "randint": lambda h: h * torch.randint(-3, 5, h.shape),
    "randint_like": lambda h: h * torch.randint_like(h, 2, 9),
    "randperm": lambda h: h[:, torch.randperm(h.shape[1])] * torch.arange(1.0, 9.0),
    "multinomial": lambda h: h[:, torch.multinomial(torch.softmax(h, -1), 3).flatten()],
    "multinomial_replacement": lambda h: h[:, torch.multinomial(torch.ones(8), 12, True)],
    "rrelu": lambda h: F.rrelu(h, training=True),
    "rrelu_": lambda h: F.rrelu_(h * 1.0, 0.2, 0.5, training=True),
    "RReLU": lambda h: _RRELU(h),
    "dropout": lambda h: F.dropout(h, 0.3, True),
    "dropout_inplace": lambda h: F.dropout(h * 1.0, 0.5, True, inplace=True),
    "native_dropout": lambda h: torch.native_dropout(h, 0.3, True)[0],
    "alpha_dropout": lambda h: F.alpha_dropout(h, 0.3, True),
    "feature_alpha_dropout": lambda h: F.feature_alpha_dropout(h[..., None], 0.3, True),
    "dropout1d": lambda h: F.dropout1d(h[None], 0.3, True)[0],
    "dropout2d": lambda h: F.dropout2d(h[None, None], 0.3, True)[0, 0],
    "dropout3d": lambda h: F.dropout3d(h[None, None, None], 0.5, True)[0, 0, 0],
    "exponential_": lambda h: h * torch.empty_like(h).exponential_(2.0),
    "cauchy_": lambda h: h * torch.empty_like(h).cauchy_().clamp(-5, 5),
    "geometric_": lambda h: h * torch.empty_like(h).geometric_(0.3),
    "log_normal_": lambda h: h * torch.empty_like(h).log_normal_(0.0, 0.5),
    "random_to": lambda h: h * torch.empty_like(h).random_(7),
    "random_": lambda h: h * torch.empty_like(h).random_().remainder(5),
    "poisson": lambda h: h * torch.poisson(h.detach().abs() * 3),
    "binomial": lambda h: h * torch.binomial(torch.full_like(h, 10.0), torch.sigmoid(h).detach()),
    "standard_gamma": lambda h: h * torch._standard_gamma(h.detach().abs() + 0.5),
    "sample_dirichlet": lambda h: h * torch._sample_dirichlet(h.detach().abs() + 0.5),
    "gumbel_softmax": lambda h: F.gumbel_softmax(h, tau=0.5, hard=True) * h,
    # in-place draws into a non-contiguous tensor, which AOT's functional forms keep exact
    "normal_T": lambda h: h * (h.t().detach() * 1.0).normal_().t(),
    "exponential_T": lambda h: h * (h.t().detach() * 1.0).exponential_().t(),
    "bernoulli_tensor_T": lambda h: h * (h.t().detach() * 1.0).bernoulli_(
        torch.sigmoid(h.t()).detach()).t(),
}


class OneOp(nn.Module):
    """One parameter, one random op."""

    def __init__(self, op: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1.5, 2.0, 8))
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x * self.w)


def train_fn(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A loss whose gradient passes through the random op."""
    return (model(x) ** 2).sum()


def _inputs(batch: int = 4) -> dict[str, torch.Tensor]:
    return {"x": torch.linspace(-2.0, 3.0, batch * 8).reshape(batch, 8)}


@functools.cache
def _traced(name: str, mode: str, dynamic: bool = False):
    model = OneOp(OPS[name])
    dims = {"x": 0} if dynamic else None
    return model, jl.trace(model, train_fn, _inputs(), mode=mode, dynamic_arg_dims=dims)


def _subject(name: str, mode: str, dynamic: bool = False, batch: int = 4):
    """The traced one-op model, its inputs and eager's step from ``SEED`` (the reference)."""
    model, joint = _traced(name, mode, dynamic)
    inputs = _inputs(batch)
    return model, joint, inputs, eager_step(model, train_fn, inputs, SEED)


def _assert_same(got, ref, what: str) -> None:
    g_loss, g_grads, _ = got
    e_loss, e_grads, _ = ref
    assert torch.equal(g_loss, e_loss), f"{what}: loss {g_loss.item()} vs eager {e_loss.item()}"
    assert list(g_grads) == list(e_grads)
    for n in e_grads:
        diff = (g_grads[n] - e_grads[n]).abs().max().item()
        assert torch.equal(g_grads[n], e_grads[n]), f"{what}: grad {n} max diff {diff}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(OPS))
def test_joint_run_draws_what_eager_draws(name, mode):
    model, joint, inputs, ref = _subject(name, mode)
    other = eager_step(model, train_fn, inputs, SEED + 1)
    assert not torch.equal(ref[0], other[0]), "the op must actually draw"
    assert any(draws_random(n) for n in joint.graph.nodes), "the Stepper must see the draw"
    torch.manual_seed(SEED)
    _assert_same(joint.run(model, inputs), ref, f"{name} joint.run")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(OPS))
def test_stepper_draws_what_eager_draws(name, mode):
    model, joint, inputs, ref = _subject(name, mode)
    torch.manual_seed(123)
    user = torch.get_rng_state()
    stepper = jl.Stepper(joint, model, inputs, device="cpu", seed=SEED)
    stepper.step(3)  # node by node, then in bulk
    _assert_same(stepper.run(), ref, f"{name} Stepper")
    assert torch.equal(torch.get_rng_state(), user), "the Stepper drew from the user's RNG"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["bernoulli", "normal_tensor_tensor", "rrelu", "randperm",
                                  "multinomial", "dropout", "exponential_", "randint_like"])
def test_dynamic_trace_draws_what_eager_draws_at_another_size(name, mode):
    model, joint, inputs, ref = _subject(name, mode, dynamic=True, batch=3)
    torch.manual_seed(SEED)
    _assert_same(joint.run(model, inputs), ref, f"{name} dynamic joint.run")


def _many(h: torch.Tensor) -> torch.Tensor:
    h = F.dropout(h, 0.2, True) + torch.randn_like(h)
    h = F.rrelu(h, training=True) * torch.bernoulli(torch.sigmoid(h))
    return h[:, torch.randperm(h.shape[1])] * torch.empty_like(h).exponential_()


@pytest.mark.parametrize("mode", MODES)
def test_compare_is_exact_for_several_draws_in_order(mode):
    model = OneOp(_many)
    joint = jl.trace(model, train_fn, _inputs(), mode=mode)
    c = jl.compare(joint, model, _inputs(), seed=SEED)
    assert c.ok and c.first_inexact is None, c
    assert (c.grads["max_abs_err"] == 0).all()


@needs_torch((2, 13, 0), "a compiled graph drawing what eager draws (torch 2.11's inductor "
             "draws other numbers even with fallback_random; jl.compare reports the MISMATCH)")
def test_compiled_graph_draws_what_eager_draws():
    model = OneOp(_many)
    joint = jl.trace(model, train_fn, _inputs())
    c = jl.compare([joint, joint.compile()], model, _inputs(), seed=SEED)
    assert c.ok, c
    assert (c.grads["max_abs_err"] == 0).all(), c.grads


# -- what cannot be exact is refused ---------------------------------------------
_GEN = torch.Generator().manual_seed(0)
_GENERATOR_OPS = {
    "randn": lambda h: h * torch.randn(h.shape, generator=_GEN),
    "bernoulli": lambda h: h * torch.bernoulli(torch.sigmoid(h), generator=_GEN),
    "normal_": lambda h: h * torch.empty_like(h).normal_(generator=_GEN),
    "randperm": lambda h: h[:, torch.randperm(8, generator=_GEN)],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(_GENERATOR_OPS))
def test_explicit_generator_is_refused(name, mode):
    model = OneOp(_GENERATOR_OPS[name])
    before, gen_state = deep_state(model), _GEN.get_state()
    with pytest.raises(UnsupportedRandomOpError) as info:
        jl.trace(model, train_fn, _inputs(), mode=mode)
    msg = str(info.value)
    assert "explicit torch.Generator" in msg and "torch.manual_seed" in msg
    assert "test_random_ops.py:" in msg  # the user's source line
    assert_unchanged(before, model)
    assert torch.equal(_GEN.get_state(), gen_state)


@pytest.mark.parametrize("mode", MODES)
def test_random_from_to_is_refused_with_an_exact_alternative(mode):
    model = OneOp(lambda h: h * torch.empty_like(h).random_(2, 9))
    before = deep_state(model)
    with pytest.raises(UnsupportedRandomOpError) as info:
        jl.trace(model, train_fn, _inputs(), mode=mode)
    msg = str(info.value)
    assert "random_(from, to)" in msg and "torch.randint_like" in msg
    assert "test_random_ops.py:" in msg
    assert isinstance(info.value.__cause__, SyntaxError)
    assert_unchanged(before, model)
    # The alternative the message names draws the same numbers as random_(from, to).
    x = torch.empty(4, 8)
    torch.manual_seed(SEED)
    a = x.clone().random_(2, 9)
    torch.manual_seed(SEED)
    assert torch.equal(torch.randint_like(x, 2, 9), a)


# AOT records a functional form that draws in another memory order on a non-contiguous x
_LAYOUT_OPS = {
    "bernoulli_": lambda h: h * (h.t().detach() * 1.0).bernoulli_(0.4).t(),
    "rrelu_then_dropout": lambda h: F.dropout(F.rrelu(h.t(), training=True), 0.5).t(),
}


def _functional_draw_differs(name: str) -> bool:
    """The premise, shown on eager kernels: the functional form draws other numbers."""
    x = torch.linspace(-2.0, 3.0, 32).reshape(4, 8).t()  # non-contiguous
    torch.manual_seed(SEED)
    if name == "bernoulli_":
        eager = x.clone().bernoulli_(0.4)
        torch.manual_seed(SEED)
        return not torch.equal(torch.ops.aten.bernoulli.p(x, 0.4), eager)
    eager = F.dropout(F.rrelu(x, training=True), 0.5)
    torch.manual_seed(SEED)
    noise = torch.empty_like(x, memory_format=torch.contiguous_format)
    out = torch.ops.aten.rrelu_with_noise_functional(x, noise, 1 / 8, 1 / 3, True)[0]
    return not torch.equal(F.dropout(out, 0.5), eager)


@pytest.mark.parametrize("name", list(_LAYOUT_OPS))
def test_layout_dependent_draw_is_refused_in_aot_and_exact_in_make_fx(name):
    assert _functional_draw_differs(name), "torch's functional form now draws what eager draws"
    model = OneOp(_LAYOUT_OPS[name])
    before = deep_state(model)
    with pytest.raises(UnsupportedRandomOpError) as info:
        jl.trace(model, train_fn, _inputs(), mode="aot")
    msg = str(info.value)
    assert "non-contiguous" in msg and "mode='make_fx'" in msg and ".contiguous()" in msg
    assert "test_random_ops.py:" in msg  # the user's source line
    assert_unchanged(before, model)
    joint = jl.trace(model, train_fn, _inputs())  # make_fx: eager's own op, exact
    torch.manual_seed(SEED)
    _assert_same(joint.run(model, _inputs()), eager_step(model, train_fn, _inputs(), SEED),
                 f"{name} make_fx joint.run")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(OPS))
def test_saved_and_loaded_graph_draws_what_eager_draws(name, mode, tmp_path):
    model, joint = _traced(name, mode)
    joint.save(str(tmp_path / "joint.zip"))
    loaded = jl.load(str(tmp_path / "joint.zip"))
    ref = eager_step(model, train_fn, _inputs(), SEED)
    torch.manual_seed(SEED)
    _assert_same(loaded.run(model, _inputs()), ref, f"{name} loaded joint.run")


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_attention_without_dropout_draws_nothing(p):
    # the CPU attention kernel is tagged nondeterministic_seeded either way; only a
    # dropout_p > 0 draws, as the global RNG state after an eager call shows
    model, x = torch.nn.Linear(8, 8), torch.randn(1, 2, 4, 8)

    def step(model, x):
        q = model(x)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=p).sum()

    joint = jl.trace(model, step, {"x": x})
    before = torch.get_rng_state()
    step(model, x)
    eager_draws = not torch.equal(before, torch.get_rng_state())
    assert any(draws_random(n) for n in joint.graph.nodes) == eager_draws == (p > 0)
