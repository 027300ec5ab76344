"""Views on values whose real strides differ from the fake ones (BatchNorm on CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from tests.util import eager_step


class TransposedBN(nn.Module):
    """BatchNorm1d over a transposed activation, then a Linear: the fuzz reproducer."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.fc = nn.Linear(4, 4, bias=False)
        self.bn = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        h = self.bn(self.fc(x).transpose(1, 2))
        return self.head(self.drop(h).transpose(1, 2))


def train_fn(model, x, y):
    return F.mse_loss(model(x), y)


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
@pytest.mark.parametrize("dynamic,dropout", [(False, 0.0), (True, 0.0), (False, 0.1)])
def test_transposed_batchnorm_runs_like_eager(mode, dynamic, dropout):
    torch.manual_seed(0)
    model, ref = TransposedBN(dropout), TransposedBN(dropout)
    ref.load_state_dict(model.state_dict())
    inputs = {"x": torch.randn(2, 5, 4), "y": torch.randn(2, 5, 3)}
    joint = jl.trace(model, train_fn, inputs, mode=mode, dynamic=dynamic)
    assert any(n.target is torch.ops.aten.reshape.default for n in joint.graph.nodes)
    for step in range(2):
        torch.manual_seed(step)
        loss, grads, _ = joint.run(model, inputs)
        eloss, egrads, _ = eager_step(ref, train_fn, inputs, seed=step)
        torch.testing.assert_close(loss, eloss)
        for k in grads:
            torch.testing.assert_close(grads[k], egrads[k])
    torch.testing.assert_close(model.bn.running_var, ref.bn.running_var)


def test_graphs_without_batchnorm_keep_their_views():
    from tests.fixtures import zoo

    f = zoo.get("tiny_lm")
    joint = jl.trace(f.make_model(), f.train_fn, f.make_inputs(4))
    targets = {n.target for n in joint.graph.nodes}
    assert torch.ops.aten.view.default in targets
    assert torch.ops.aten.reshape.default not in targets
