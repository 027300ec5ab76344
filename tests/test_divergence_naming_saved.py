"""A wrong backward decomposition is named at its op, not at a log-softmax saved for the backward.

make_fx traces ``cross_entropy`` as ``_log_softmax`` plus ``detach`` nodes of
its result (saved for ``_log_softmax_backward_data``), and Inductor's provenance
derives the post-grad node holding the result from all three. Pairing each
post-grad node with the *last* traced node it derives from gave the result to a
``detach``, and the ``_log_softmax`` was paired with ``x - max`` (an
intermediate of the same shape): ``first_divergence`` named ``_log_softmax``
(rel err 1) for a bug planted in ``sigmoid_backward`` (the held-out suite's
GRU, bench/bench_heldout_compile.py). The reference is where the bug was put:
Inductor's decomposition of ``aten.sigmoid_backward`` scaled by 1.001 while the
graph compiles. One small Inductor compile.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab import torch_compat
from tests.util import compare_with_planted_bug

aten = torch.ops.aten


def _model_and_inputs():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Sigmoid(), nn.Linear(16, 4))
    return model, {"x": torch.randn(6, 8, generator=g),
                   "y": torch.randint(0, 4, (6,), generator=g)}


def _ce(m, x, y):
    return F.cross_entropy(m(x), y)


def test_a_wrong_backward_decomposition_is_named_at_its_op_past_a_log_softmax(monkeypatch):
    model, inputs = _model_and_inputs()
    joint = jl.trace(model, _ce, inputs)
    op = aten.sigmoid_backward.default
    assert any(n.target is aten._log_softmax.default for n in joint.graph.nodes)
    assert any(n.target is op for n in joint.graph.nodes)
    decomp = torch_compat.torch_module("torch._inductor.decomposition", "inject a wrong one")
    base = decomp.decompositions[op]
    monkeypatch.setitem(decomp.decompositions, op, lambda *a: base(*a) * 1.001)
    c = compare_with_planted_bug(joint, model, inputs, monkeypatch)
    print(c)
    assert c.verdict == "MISMATCH", repr(c)
    assert c.kernels["inductor"].first is None, repr(c)  # it arose before lowering
    d = c.first_divergence
    assert d is not None and d.what == "output after Inductor's decompositions", repr(c)
    by_name = {n.name: n for n in joint.graph.nodes}
    assert by_name[d.node].target is op, str(d)  # the op the bug was planted in
    assert 5e-4 < d.max_rel_err < 2e-3, str(d)
