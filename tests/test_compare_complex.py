"""compare() judges complex values by both parts (complex rotary embeddings)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl


class _Freqs(nn.Module):
    def forward(self, x):  # complex rotations e^{i a}, a = 0, 0.3, 0.6, 0.9
        angle = torch.arange(4, dtype=x.dtype) * 0.3 + x.sum() * 0
        return torch.polar(torch.ones_like(angle), angle)


class _ComplexRotary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.freqs = nn.Linear(8, 8), _Freqs()

    def forward(self, x):
        q = torch.view_as_complex(self.q(x).view(x.shape[0], 4, 2))
        return torch.view_as_real(q * self.freqs(x)).flatten(1)


def _step(model, x, y):
    return F.mse_loss(model(x), y)


def test_compare_counts_the_imaginary_part_of_complex_values():
    aten = torch.ops.aten
    torch.manual_seed(0)
    model = _ComplexRotary()
    inputs = {"x": torch.randn(3, 8), "y": torch.randn(3, 8)}
    joint = jl.trace(model, _step, inputs)
    polar = next(n for n in joint.graph.nodes if n.target == aten.polar.default)
    with joint.graph.inserting_before(polar):
        neg = joint.graph.call_function(aten.neg.default, (polar.args[1],))
    polar.args = (polar.args[0], neg)  # e^{-ia}: the same real part, the imaginary negated
    joint.recompute()
    c = jl.compare(joint, model, inputs, train_fn=_step)
    assert not c.ok
    d = c.first_divergence
    assert d.module == "freqs" and d.what == "module output"
    # Reference: |e^{ia} - e^{-ia}| = 2 sin(a), largest at a = 0.9; relative to |e^{ia}| = 1.
    want = 2 * torch.sin(torch.tensor(0.9, dtype=torch.float64)).item()
    assert abs(d.max_abs_err - want) < 1e-6 and abs(d.max_rel_err - want) < 1e-6, d
