"""A diverging fused kernel is named at the op whose result differs, not at its first node.

The held-out suite (bench/bench_heldout_compile.py) planted a wrong lowering in
Qwen2-MoE's ``silu``; the kernel named was right (it fuses the embedding, the
RMSNorm and the expert's ``silu``) but ``first_divergence`` read
``embedding [kernel output, model.embed_tokens]``: the kernel's first traced
node, since the diverging buffer's post-grad node (``div_3``) is no traced
node. The same happened when a post-grad name happened to be a traced one
(``native_batch_norm_9`` for a ReLU backward). The reference is where the bug
was put: ``aten.neg``'s lowering (``silu`` decomposes to ``x / (1 + exp(-x))``)
scaled by 1.001, in a kernel that fuses a ``mul`` before the ``silu``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab import torch_compat
from tests.util import compare_with_planted_bug

aten = torch.ops.aten


class _Twice(nn.Module):
    def forward(self, x):
        return x * 2.0


def _setup():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), _Twice(), nn.SiLU(), nn.Linear(16, 4))
    return model, {"x": torch.randn(6, 8, generator=g), "y": torch.randn(6, 4, generator=g)}


def _mse(m, x, y):
    return F.mse_loss(m(x), y)


def _compare_with_wrong_lowering(joint, model, inputs, monkeypatch, op):
    """The Inductor compile of ``joint`` run with ``op`` lowered as ``op(x) * 1.001``, compared."""
    lowering = torch_compat.torch_module("torch._inductor.lowering", "inject a wrong lowering")
    right, mul = lowering.lowerings[op], lowering.lowerings[aten.mul.Tensor]
    monkeypatch.setitem(lowering.lowerings, op, lambda x: mul(right(x), 1.001))
    return compare_with_planted_bug(joint, model, inputs, monkeypatch)


def test_a_fused_kernel_is_named_at_the_op_whose_result_diverges(monkeypatch):
    model, inputs = _setup()
    joint = jl.trace(model, _mse, inputs)
    c = _compare_with_wrong_lowering(joint, model, inputs, monkeypatch, aten.neg.default)
    print(c)
    assert c.verdict == "MISMATCH", repr(c)
    first = c.kernels["inductor"].first
    d = c.first_divergence
    assert d is not None and d.kernel == first.kernel and d.what == "kernel output", repr(c)
    by_name = {n.name: n for n in joint.graph.nodes}
    assert {"mul", "silu"} <= {str(by_name[n].target).split(".")[1] for n in first.nodes}, first
    assert by_name[d.node].target is aten.silu.default, str(d)  # not the fused mul before it
    assert d.module == "2" and d.phase == "forward", str(d)


class _MLP3d(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def test_a_kernel_output_read_through_a_view_is_named_at_the_op_that_computed_it(monkeypatch):
    # (batch, tokens, d) inputs: fc2 reads gelu's output through a view, and Inductor's
    # provenance derives the buffer from that view too (DeiT read 'view_16 ... mlp.fc2')
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = _MLP3d()
    inputs = {"x": torch.randn(2, 5, 16, generator=g), "y": torch.randn(2, 5, 16, generator=g)}
    joint = jl.trace(model, _mse, inputs)
    c = _compare_with_wrong_lowering(joint, model, inputs, monkeypatch, aten.erf.default)
    print(c)
    d = c.first_divergence
    assert c.verdict == "MISMATCH" and d is not None and d.what == "kernel output", repr(c)
    by_name = {n.name: n for n in joint.graph.nodes}
    assert by_name[d.node].target is aten.gelu.default, str(d)
    assert "fc2" not in d.module and d.phase == "forward", str(d)  # F.gelu: the root
