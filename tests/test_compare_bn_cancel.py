"""No false MISMATCH for gradients a train-mode norm cancels (issue 41, items 1 and 2).

A conv bias feeding a train-mode BatchNorm gets a gradient that is zero in exact
arithmetic (the norm subtracts the batch mean); so does a LayerNorm bias feeding
a 1x1 conv and then a BatchNorm. Both sides return rounding noise there (1e-9),
which must be judged by the magnitudes the backward op summed, not by its own
size. The references are eager autograd (``jl.compare``'s) and, for the bugs, a
wrong BatchNorm backward (its batch mean of ``dy`` off by 1e-3 or 1e-2): a
gradient that is no longer zero must still be a MISMATCH. Inductor compiles are
one small conv net each.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab import meta, torch_compat
from tests.util import compare_with_planted_bug, one_thread

aten = torch.ops.aten


def _conv_bn():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 1, 1))
    g = torch.Generator().manual_seed(0)
    inputs = {"x": torch.randn(2, 3, 16, 16, generator=g),
              "y": torch.randn(2, 1, 16, 16, generator=g)}
    return model, inputs


def _mse(m, x, y):
    return F.mse_loss(m(x), y)


class _MobileViTLike(nn.Module):
    """conv -> BN (train) -> SiLU, then MobileViT's bilinear resize around a token branch
    (LayerNorm -> 1x1 conv -> BN), fused with a local conv -> BN by concatenation and a
    1x1 conv -> BN."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.local, self.bnl = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.ln, self.proj, self.bn2 = nn.LayerNorm(16), nn.Conv2d(16, 16, 1), nn.BatchNorm2d(16)
        self.fuse, self.bn3 = nn.Conv2d(48, 16, 1), nn.BatchNorm2d(16)
        self.head = nn.Conv2d(16, 1, 1)

    def forward(self, x):
        h = F.silu(self.bn(self.conv(x)))
        t = F.interpolate(h, size=(6, 6), mode="bilinear", align_corners=False)
        t = self.ln(t.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        t = F.silu(self.bn2(self.proj(t)))
        t = F.interpolate(t, size=(8, 8), mode="bilinear", align_corners=False)
        f = torch.cat([h, self.bnl(self.local(h)), t + h], 1)  # no activation: as reduce_1x1
        return self.head(F.silu(self.bn3(self.fuse(f))))


def _mobilevit_like():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return _MobileViTLike(), {"x": torch.randn(2, 3, 8, 8, generator=g),
                              "y": torch.randn(2, 1, 8, 8, generator=g)}


# Biases whose gradient the BatchNorm after them cancels (zero in exact arithmetic).
_CANCELLED = ["conv.bias", "local.bias", "bnl.bias", "ln.bias", "proj.bias", "fuse.bias"]


def _wrong_bn_backward(factor: float, base=aten.native_batch_norm_backward.default):
    """``native_batch_norm_backward`` (``base``) with the batch mean of ``dy`` scaled by
    ``factor``."""
    def bn_backward(dy, x, w, rm, rv, save_mean, save_invstd, train, eps, mask):
        dx, dw, db = base(dy, x, w, rm, rv, save_mean, save_invstd, train, eps, mask)
        shape = [1, -1] + [1] * (x.dim() - 2)
        off = (factor - 1) * dy.mean([d for d in range(dy.dim()) if d != 1])
        return dx - (off * save_invstd * w).reshape(shape), dw, db
    return bn_backward


@pytest.fixture(scope="module")
def compiled_conv_bn():
    model, inputs = _conv_bn()
    with one_thread():
        joint = jl.trace(model, _mse, inputs)
        return model, inputs, joint, joint.compile("inductor")


def test_compiled_conv_bias_before_batchnorm_is_no_mismatch(compiled_conv_bn):
    model, inputs, _, compiled = compiled_conv_bn
    with one_thread():
        c = compiled.compare(model, inputs)
    print(c)
    assert c.ok and c.verdict == "within tolerance" and c.first_divergence is None, repr(c)
    row = c.grads[(c.grads["candidate"] == "inductor") & (c.grads["name"] == "0.bias")]
    # rounding noise: tiny in absolute terms, unrelated in direction (why it was a MISMATCH)
    assert bool(row["ok"].all()) and float(row["max_abs_err"].max()) < 1e-6, row
    eager = model[0].bias  # the gradient itself is noise around zero
    loss = _mse(model, **inputs)
    (g,) = torch.autograd.grad(loss, [eager])
    assert float(g.abs().max()) < 1e-6


@pytest.mark.parametrize("factor", [1.001, 1.01])
def test_a_wrong_compiled_batchnorm_backward_is_still_a_mismatch(monkeypatch, factor):
    # Inductor's decomposition of BatchNorm's backward subtracting 1.001 x the batch mean
    # of dy: the conv bias's gradient is no longer zero, by far more than rounding
    model, inputs = _conv_bn()
    decomp = torch_compat.torch_module("torch._inductor.decomposition", "inject a wrong one")
    op = aten.native_batch_norm_backward.default
    monkeypatch.setitem(decomp.decompositions, op,
                        _wrong_bn_backward(factor, decomp.decompositions[op]))
    c = compare_with_planted_bug(jl.trace(model, _mse, inputs), model, inputs, monkeypatch)
    print(c)
    assert c.verdict == "MISMATCH" and not c.ok, repr(c)
    bad_rows = c.grads[(c.grads["candidate"] == "inductor") & ~c.grads["ok"].astype(bool)]
    # only the conv the wrong backward feeds: its bias always (the BN's own are right)
    assert "0.bias" in set(bad_rows["name"]) <= {"0.bias", "0.weight"}, bad_rows
    d = c.first_divergence
    assert d is not None and d.candidate == "inductor", repr(c)
    assert d.module in ("0", "1") or d.kernel, str(d)


def test_aot_biases_before_batchnorm_are_no_mismatch():
    model, inputs = _mobilevit_like()
    joint = jl.trace(model, _mse, inputs, mode="aot")
    c = jl.compare(joint, model, inputs)
    print(c)
    assert c.ok and c.verdict == "within tolerance" and c.first_divergence is None, repr(c)
    rows = c.grads.set_index("name")
    # AOT's bilinear backward sums in another order: the cancelled biases differ
    # (relative errors far above 1e-5) but by rounding of the terms they sum
    assert float(rows.loc[_CANCELLED, "max_rel_err"].max()) > 1.0, rows
    assert float(rows.loc[_CANCELLED, "max_abs_err"].max()) < 1e-6, rows


def _break_batch_norm_backward(joint, module: str, factor: float) -> None:
    """Make the traced graph's BatchNorm backward of ``module`` the wrong one."""
    for node in joint.graph.nodes:
        if node.target is aten.native_batch_norm_backward.default \
                and meta.info(node).get("module") == module:
            node.target = _wrong_bn_backward(factor)
            joint.recompute()
            return
    raise AssertionError(f"no BatchNorm backward of {module}")


def test_a_wrong_batchnorm_backward_in_an_aot_graph_is_a_mismatch_there():
    model, inputs = _mobilevit_like()
    joint = jl.trace(model, _mse, inputs, mode="aot")
    _break_batch_norm_backward(joint, "bn2", 1.001)
    c = jl.compare(joint, model, inputs)
    print(c)
    assert c.verdict == "MISMATCH" and not c.ok, repr(c)
    d = c.first_divergence
    # the first wrong value: the gradient flowing out of bn2 into proj, or proj's bias
    assert d is not None and d.module in ("proj", "bn2"), str(d)
    bad = set(c.grads[~c.grads["ok"].astype(bool)]["name"])
    assert "proj.bias" in bad, c.grads
    assert bad <= {"proj.bias", "proj.weight", "ln.bias", "ln.weight", "bn.bias", "bn.weight",
                   "conv.bias", "conv.weight"}, bad  # upstream of bn2 only


def test_scale_keeps_the_sign_of_a_dimension():
    # issue 44 item 5: unsqueeze(x, -1) was scaled as unsqueeze(|x|, 1)
    from jointlab.analysis.compare.scale import produced_scale

    def f(x):
        return x.unsqueeze(-1).sum(1) - x.sum(1, keepdim=True)  # zero: a sum that cancels

    gm = torch.fx.experimental.proxy_tensor.make_fx(f)(torch.randn(3, 2))
    vals = {}
    x = torch.tensor([[1.0, -1.0], [2.0, -2.0], [3.0, 3.0]])
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            vals[node] = x
        elif node.op == "call_function":
            vals[node] = node.target(*[vals.get(a, a) for a in node.args])
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    out = out[0] if isinstance(out, (list, tuple)) else out
    s = produced_scale(out, vals.get)
    torch.testing.assert_close(s, torch.tensor([[4.0], [8.0], [12.0]]))
