"""torch's caches of a module's parameters are put back after a trace, without a warning."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import jointlab as jl


class _Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(4, 8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_an_lstm_traces_without_a_side_effect_warning_and_keeps_its_real_weights(mode):
    torch.manual_seed(0)
    model, x = _Tagger(), torch.randn(2, 5, 4)
    step = lambda m, x: m(x).square().mean()  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error", jl.errors.SideEffectWarning)
        joint = jl.trace(model, step, {"x": x}, mode=mode)
    rnn = model.rnn
    # the flat weight list is the module's own parameters again, not the trace's fakes
    assert all(w is getattr(rnn, n) for w, n in zip(rnn._flat_weights, rnn._flat_weights_names))
    loss = step(model, x)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    result = joint.run(model, {"x": x})
    torch.testing.assert_close(result.loss, loss)
    for (name, _), g in zip(model.named_parameters(), grads):
        torch.testing.assert_close(result.grads[name], g)
