"""A trace whose backward raises (either mode) leaves no torch state behind for the next one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import jointlab as jl
from jointlab import errors


class _Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("this backward always fails")


class _Fails(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return _Boom.apply(self.fc(torch.tanh(self.fc(x))))


def _output_meta(joint) -> dict:
    out = next(n for n in joint.graph.nodes if n.op == "output")
    return {k: out.meta.get(k) for k in ("autograd_backward", "stack_trace")}


@pytest.mark.parametrize("failing_mode", ["make_fx", "aot"])
def test_a_failed_backward_does_not_mark_the_next_traces_output(failing_mode):
    # torch keeps "end-of-backward callback queued" in a module global: a backward that
    # raised left it set, and every later make_fx trace put its last backward node's
    # stack trace and backward mark on the output node
    model, inputs = nn.Sequential(nn.Linear(4, 4), nn.Tanh()), {"x": torch.randn(2, 4)}
    step = lambda m, x: m(x).sum()  # noqa: E731
    clean = _output_meta(jl.trace(model, step, inputs))
    assert clean["autograd_backward"] is None
    with pytest.raises(errors.JointlabError, match="this backward always fails"):
        jl.trace(_Fails(), step, inputs, mode=failing_mode)
    assert _output_meta(jl.trace(model, step, inputs)) == clean
