"""Parameter hooks registered before tracing run in the traced backward, as in eager.

The reference is eager autograd itself: ``loss.backward()`` on the same model,
whose parameters carry the same hooks, read from ``p.grad``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import jointlab as jl
from jointlab.torch_compat import post_accumulate_grad_hooks, tensor_hooks
from tests.util import assert_unchanged, deep_state

MODES = ["make_fx", "aot"]


class TiedLM(nn.Module):
    """An embedding shared with the output layer (one Parameter, two FQNs)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.mid = nn.Linear(6, 6)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mid(self.emb(x))))


def _mlp_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    inputs = {"x": torch.randn(5, 8), "y": torch.randn(5, 4)}
    return model, (lambda m, x, y: nn.functional.mse_loss(m(x), y)), inputs


def _tied_step():
    torch.manual_seed(0)
    model = TiedLM()
    inputs = {"x": torch.randint(0, 11, (4, 5)), "y": torch.randint(0, 11, (4, 5))}
    return model, (lambda m, x, y: nn.functional.cross_entropy(
        m(x).flatten(0, 1), y.flatten())), inputs


SCALE = 0.3  # not a power of two: scaling before or after a sum differs in the last bit

#: case: (step, parameter FQN, hooks in registration order)
CASES = {
    "negate": (_mlp_step, "0.weight", [lambda g: -g]),
    "closure": (_mlp_step, "2.bias", [lambda g: g * SCALE]),
    "two_in_order": (_mlp_step, "0.weight", [lambda g: g * 2, lambda g: g + 1]),
    "tied": (_tied_step, "emb.weight", [lambda g: g * SCALE, lambda g: g + 1]),
}


def _hooked(case: str):
    step, name, hooks = CASES[case]
    model, train_fn, inputs = step()
    p = model.get_parameter(name)
    for fn in hooks:
        p.register_hook(fn)
    return model, train_fn, inputs, name


def _eager(model: nn.Module, train_fn, inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``loss.backward()`` on the hooked model: the loss and each ``p.grad``."""
    model.zero_grad(set_to_none=True)
    loss = train_fn(model, **inputs)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def _assert_matches(result, loss: torch.Tensor, grads: dict[str, torch.Tensor], what: str):
    assert torch.equal(result[0], loss), f"{what}: loss differs"
    assert result[1].keys() == grads.keys(), f"{what}: gradient names differ"
    for n, g in grads.items():
        assert torch.equal(result[1][n], g), f"{what}: gradient of {n} differs from eager's"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(CASES))
def test_hooks_run_in_the_graph_bit_exact_against_eager(case, mode, tmp_path):
    model, train_fn, inputs, name = _hooked(case)
    hooks_before = tensor_hooks(model.get_parameter(name))
    before = deep_state(model)
    joint = jl.trace(model, train_fn, inputs, mode=mode)
    assert_unchanged(before, model)
    assert tensor_hooks(model.get_parameter(name)) == hooks_before  # the user's hooks stay
    loss, grads = _eager(model, train_fn, inputs)
    _assert_matches(joint.run(model, inputs), loss, grads, "joint.run")
    _assert_matches(jl.Stepper(joint, model, inputs, device="cpu").run(), loss, grads,
                    "Stepper.run")
    joint.save(str(tmp_path / "hooked.jlg"))
    _assert_matches(jl.load(str(tmp_path / "hooked.jlg")).run(model, inputs), loss, grads,
                    "the loaded graph")


@pytest.mark.parametrize("mode", MODES)
def test_a_dynamic_trace_keeps_the_hooks_at_another_size(mode):
    model, train_fn, inputs, _ = _hooked("tied")
    joint = jl.trace(model, train_fn, inputs, mode=mode, dynamic=True)
    longer = {k: torch.cat([v, v[:2]]) for k, v in inputs.items()}
    _assert_matches(joint.run(model, longer), *_eager(model, train_fn, longer), "joint.run")


@pytest.mark.parametrize("mode", MODES)
def test_accumulate_writes_the_hooked_gradient_like_backward(mode):
    model, train_fn, inputs, name = _hooked("two_in_order")
    joint = jl.trace(model, train_fn, inputs, mode=mode)
    _, grads = _eager(model, train_fn, inputs)
    joint.run(model, inputs, accumulate=True)
    assert torch.equal(model.get_parameter(name).grad, grads[name])


def test_hook_order_and_closure_matter():
    # the references above are discriminating: eager's result depends on both
    model, train_fn, inputs, name = _hooked("two_in_order")
    hooked = _eager(model, train_fn, inputs)[1][name]
    plain = _eager(*_mlp_step())[1][name]
    assert torch.equal(hooked, plain * 2 + 1) and not torch.equal(hooked, (plain + 1) * 2)


@pytest.mark.parametrize("mode", MODES)
def test_hook_nodes_are_backward_nodes_of_the_parameters_module(mode):
    model, train_fn, inputs, _ = _hooked("negate")
    nodes = jl.trace(model, train_fn, inputs, mode=mode).nodes
    neg = nodes[nodes.target.astype(str) == "aten.neg"]
    assert len(neg) == 1, nodes.target.tolist()
    assert neg.phase.tolist() == ["backward"] and neg.module.tolist() == ["0"]


@pytest.mark.parametrize("mode", MODES)
def test_post_accumulate_grad_hook_is_refused_naming_the_parameter(mode):
    model, train_fn, inputs = _mlp_step()
    model[2].weight.register_post_accumulate_grad_hook(lambda p: None)
    before = deep_state(model)
    with pytest.raises(jl.errors.UnsupportedHookError) as info:
        jl.trace(model, train_fn, inputs, mode=mode)
    assert isinstance(info.value, jl.errors.TraceError)
    msg = str(info.value)
    for part in ("'2.weight'", "register_post_accumulate_grad_hook", "after the gradient is "
                 "written to p.grad", "Remove the hook while tracing",
                 "joint.run(model, inputs, accumulate=True)"):
        assert part in msg, msg
    assert_unchanged(before, model)


def test_hook_accessors_refuse_a_torch_that_keeps_hooks_elsewhere():
    for read, api in ((tensor_hooks, "Tensor._backward_hooks"),
                      (post_accumulate_grad_hooks, "Tensor._post_accumulate_grad_hooks")):
        with pytest.raises(jl.errors.UnsupportedTorchError, match=api.replace(".", r"\.")):
            read(object())
        assert read(torch.zeros(1, requires_grad=True)) == []
