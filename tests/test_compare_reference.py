"""compare's eager reference: the model as the user holds it, left exactly as it was.

The reference each test checks against is independent of compare: plain eager
``loss.backward()`` on a deep copy with the parameter hook registered again (or
the hand-negated gradient), and ``tests/util.py``'s ``deep_state`` for the model.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import jointlab as jl
from jointlab.analysis.compare import compare as compare_mod
from jointlab.analysis.compare.fp64 import fp64_reference
from jointlab.runtime.kept import hooked_copy, model_kept
from tests.util import assert_unchanged, deep_state


def _negate(g: torch.Tensor) -> torch.Tensor:
    return -g


def _mse(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x), y)


def _hooked_mlp() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    m[0].weight.register_hook(_negate)  # before tracing, as in issue 40 item 1
    return m, {"x": torch.randn(5, 8), "y": torch.randn(5, 4)}


def _true_eager_grads(model: nn.Module, inputs: dict) -> dict[str, torch.Tensor]:
    """``loss.backward()`` on a deep copy with the hook registered again (deepcopy drops it)."""
    ref = copy.deepcopy(model)
    assert not ref[0].weight._backward_hooks  # the very loss compare once suffered
    ref[0].weight.register_hook(_negate)
    _mse(ref, **inputs).backward()
    return {n: p.grad for n, p in ref.named_parameters()}


def _spy_eager(monkeypatch) -> list:
    """Record what compare's own eager capture returns."""
    seen, real = [], compare_mod.capture_eager

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]
    monkeypatch.setattr(compare_mod, "capture_eager", spy)
    return seen


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_eager_reference_applies_a_parameter_hook_registered_before_tracing(mode, monkeypatch):
    model, inputs = _hooked_mlp()
    truth = _true_eager_grads(model, inputs)
    unhooked = copy.deepcopy(model)
    _mse(unhooked, **inputs).backward()
    assert torch.equal(truth["0.weight"], -unhooked[0].weight.grad)  # the hook matters
    joint = jl.trace(model, _mse, inputs, mode=mode)
    seen = _spy_eager(monkeypatch)
    c = jl.compare(joint, model, inputs)
    (eager,) = seen
    for name, want in truth.items():
        assert torch.equal(eager.grads[name], want), name
    # The verdict follows the graph against true eager (before and after the graph
    # applies parameter hooks itself): never 'bit-exact' for a wrong gradient.
    got = joint.run(model, inputs).grads
    graph_exact = all(torch.equal(got[n], truth[n]) for n in truth)
    assert (c.verdict == "bit-exact") == graph_exact, c
    row = c.grads.set_index("name").loc["0.weight"]
    assert row["max_abs_err"] == float((got["0.weight"] - truth["0.weight"]).abs().max())
    if not graph_exact:
        assert c.verdict == "MISMATCH" and not row["ok"]


class _Counted(nn.Module):
    """BatchNorm in train mode, a Python counter bumped in forward, optionally a plain tensor."""

    def __init__(self, tensor: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6)
        self.calls = 0
        self.seen = torch.zeros(()) if tensor else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.seen is not None:
            self.seen.add_(1)  # a plain tensor attribute, changed in place
        return self.bn(self.lin(x))


def _sum_loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).pow(2).mean()


def _counted(tensor: bool = False) -> tuple[_Counted, dict[str, torch.Tensor]]:
    torch.manual_seed(1)
    model = _Counted(tensor).train()
    model.lin.weight.register_hook(_negate)
    for p in model.parameters():  # a .grad the user holds, object and value
        p.grad = torch.full_like(p, 0.5)
    return model, {"x": torch.randn(8, 6)}


def test_model_kept_puts_back_every_value_flag_attribute_and_the_rng():
    model, inputs = _counted(tensor=True)
    before, calls, seen, names = deep_state(model), model.calls, model.seen.clone(), vars(model)
    names = sorted(names)
    with model_kept(model):
        _sum_loss(model, **inputs).backward()  # running stats, .grad, counter, tensor move
        torch.rand(3)
        model.lin.weight.requires_grad_(False)
        model.eval()
        model.extra = 1
        model.bn.running_var = torch.ones(6)  # a buffer replaced by another object
    assert_unchanged(before, model)  # values, .grad objects and values, flags, RNG
    assert (model.calls, sorted(vars(model))) == (calls, names)
    assert torch.equal(model.seen, seen)


def _true_grad(model: _Counted, inputs: dict) -> torch.Tensor:
    ref = copy.deepcopy(model)
    ref.lin.weight.register_hook(_negate)  # deepcopy dropped it
    ref.lin.weight.grad = None
    _sum_loss(ref, **inputs).backward()
    return ref.lin.weight.grad


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_compare_leaves_the_model_bit_identical(mode):
    model, inputs = _counted()
    joint = jl.trace(model, _sum_loss, inputs, mode=mode)
    model.calls = 0  # the trace's own bump (issue 40 item 9 is not this test's)
    before, names = deep_state(model), sorted(vars(model))
    c = jl.compare(joint, model, inputs)
    assert len(c.buffers) and c.buffers["ok"].all()  # eager's running stats moved too
    assert_unchanged(before, model)  # running stats, .grad objects and values, flags, RNG
    assert (model.calls, sorted(vars(model))) == (0, names)  # eager bumped it: put back
    truth = _true_grad(model, inputs)
    got = joint.run(model, inputs).grads["lin.weight"]  # last: it moves the running stats
    assert (c.verdict == "bit-exact") == torch.equal(got, truth)


def test_hooked_copy_carries_parameter_hooks():
    # compare(device=...) with the model elsewhere copies it; a CPU-only machine cannot
    # run that path through compare, so the copy it uses is checked here directly.
    model, inputs = _hooked_mlp()
    fired = []
    model[2].weight.register_post_accumulate_grad_hook(lambda p: fired.append(p))
    truth = _true_eager_grads(model, inputs)
    dup = hooked_copy(model, "cpu")
    _mse(dup, **inputs).backward()
    assert torch.equal(dup[0].weight.grad, truth["0.weight"])
    assert fired == [dup[2].weight]
    assert model[0].weight.grad is None  # the original is untouched


def test_fp64_reference_carries_parameter_hooks():
    model, inputs = _hooked_mlp()
    before = deep_state(model)
    ref = fp64_reference(model, _mse, inputs, ["0.weight", "2.weight"], 0, torch.device("cpu"))
    m64 = copy.deepcopy(model).double()
    _mse(m64, **{k: v.double() for k, v in inputs.items()}).backward()
    assert torch.equal(ref.grads["0.weight"], -m64[0].weight.grad)  # deepcopy lost the hook
    assert torch.equal(ref.grads["2.weight"], m64[2].weight.grad)
    assert_unchanged(before, model)


class _HooksOnFirstCall(nn.Module):
    """Like transformers' output capturing: the first forward registers a hook and a flag;
    the hook adds what it sees to a running total that the loss reads."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.seen: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not getattr(self, "_installed", False):
            self.lin.register_forward_hook(lambda m, a, o: self.seen.append(o))
            self._installed = True
        self.seen.clear()
        out = self.lin(x)
        return out * len(self.seen)  # 1 with one hook; 2 if the hook were registered twice


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_hooks_a_forward_registers_on_first_call_are_undone_with_their_flag(mode):
    torch.manual_seed(0)
    model, inputs = _HooksOnFirstCall(), {"x": torch.randn(2, 4)}
    joint = jl.trace(model, _sum_loss, inputs, mode=mode)
    before = deep_state(model)
    for _ in range(2):  # a second compare must not see the hook twice
        assert jl.compare(joint, model, inputs).verdict == "bit-exact"
        assert not model.lin._forward_hooks and not hasattr(model, "_installed")
    assert_unchanged(before, model)
