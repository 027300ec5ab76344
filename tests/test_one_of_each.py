"""One definition each: random ops, handler tables, deprecated spellings (#44 items 4, 6)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.trace.function_checks import checked_user_code, trace_handlers


class _Noisy(nn.Module):
    """RReLU in training mode (rrelu_with_noise) and torch.normal with tensor arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        h = F.rrelu(self.fc(x), training=True)
        return h + torch.normal(h.detach(), torch.ones_like(h))


def _draws_differ(node_target, args) -> bool:
    """The op gives other values under another seed: an independent check that it is random."""
    torch.manual_seed(0)
    a = node_target(*args)
    torch.manual_seed(1)
    b = node_target(*args)
    a = a[0] if isinstance(a, tuple) else a
    b = b[0] if isinstance(b, tuple) else b
    return not torch.equal(a, b)


def test_every_op_that_draws_is_in_the_rng_category():
    model = _Noisy()
    inputs = {"x": torch.randn(4, 6)}
    joint = jl.trace(model, lambda m, x: m(x).sum(), inputs)
    table = joint.nodes
    ops = {"rrelu_with_noise": (-torch.rand(4, 6), torch.zeros(4, 6), 0.1, 0.3, True),
           "normal": (torch.zeros(4, 6), torch.ones(4, 6))}
    for name, args in ops.items():
        nodes = [n for n in joint.graph.nodes if n.op == "call_function"
                 and str(n.target).split(".")[1] == name]
        assert nodes, name
        for n in nodes:
            assert _draws_differ(n.target, args), n.target
            assert table.loc[n.name, "category"] == "rng", (n.target, table.loc[n.name, "category"])


def test_two_handlers_for_one_function_both_run():
    seen: list[str] = []
    with trace_handlers({torch.add: lambda f, a, k: seen.append("trace-wide")}), \
            trace_handlers({torch.add: lambda f, a, k: seen.append("inner trace")}), \
            checked_user_code({torch.add: lambda f, a, k: seen.append("train_fn")}):
        torch.add(torch.ones(1), 1)
    assert seen == ["trace-wide", "inner trace", "train_fn"]


def test_invalidate_warns_and_still_recomputes():
    model = nn.Linear(3, 1)
    joint = jl.trace(model, lambda m, x: m(x).sum(), {"x": torch.randn(2, 3)})
    with pytest.warns(DeprecationWarning, match=r"recompute\(\)") as rec:
        joint.invalidate()
    assert rec[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        joint.recompute()
    torch.testing.assert_close(joint.run(model, {"x": torch.ones(2, 3)}).loss,
                               model(torch.ones(2, 3)).sum())
