"""jl.record on attention with a -inf mask: the mask is reported as such, a real NaN still counted.

The reference is independent of jointlab: ``torch.isnan``/``torch.isinf`` on the
values the record kept.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab import meta as _meta


class _Attention(nn.Module):
    """One causal self-attention as HF eager attention writes it: scores + (-inf mask)."""

    def __init__(self, d: int = 8, sdpa: bool = False) -> None:
        super().__init__()
        self.qkv, self.out, self.sdpa = nn.Linear(d, 3 * d), nn.Linear(d, d), sdpa

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        s = x.shape[1]
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        mask = torch.where(causal, 0.0, float("-inf"))  # HF-style additive mask
        if self.sdpa:
            h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            h = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask, -1) @ v
        return self.out(h)


def _train_fn(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).pow(2).mean()


def _record(sdpa: bool, x: torch.Tensor):
    torch.manual_seed(0)
    model = _Attention(sdpa=sdpa)
    joint = jl.trace(model, _train_fn, {"x": x})
    return joint, jl.record(joint, model, {"x": x}, keep_bytes=1 << 24)


def _reference(rec) -> tuple[dict[str, int], dict[str, int]]:
    """Per kept value: NaN and +-Inf counts, and its -inf count (torch, not jointlab)."""
    nonfinite, neg = {}, {}
    for name, v in rec.values.items():
        if v.dtype.is_floating_point:
            nonfinite[name] = int(torch.isnan(v).sum() + torch.isinf(v).sum())
            neg[name] = int((v == -math.inf).sum())
    return nonfinite, neg


def test_clean_attention_mask_is_reported_as_a_mask_not_a_problem():
    for sdpa in (False, True):
        joint, rec = _record(sdpa, torch.randn(2, 5, 8))
        nonfinite, neg = _reference(rec)
        with_inf = {n for n, c in nonfinite.items() if c}
        assert with_inf, "the mask holds -inf"
        assert all(neg[n] == nonfinite[n] for n in with_inf)  # all of it -inf
        t = rec.table
        assert set(t.index[t["mask"]]) == with_inf, sdpa  # every -inf value is a mask
        assert (t.loc[list(with_inf), "inf"] == [nonfinite[n] for n in with_inf]).all()
        assert sum(rec.layers()["nan/inf"].values()) == 0
        assert " 0 with NaN/Inf (" in repr(rec) and "attention masks" in repr(rec)


def test_injected_nan_is_still_counted_next_to_a_mask():
    x = torch.randn(2, 5, 8)
    x[0, 1, 2] = math.nan
    joint, rec = _record(False, x)
    nonfinite, neg = _reference(rec)
    t = rec.table
    problems = {n for n, c in nonfinite.items() if c and neg[n] != c}  # holds NaN or +inf
    assert problems
    layer = rec.layers()["nan/inf"]
    for n in problems:
        assert not t.loc[n, "mask"], n
        assert layer[n] == nonfinite[n], n
    x_node = next(n for n in joint.placeholders if _meta.info(n).get("input_path") == "x")
    assert layer[x_node.name] == 1
    n_bad = sum(1 for n in t.index if n in nonfinite and nonfinite[n] and not t.loc[n, "mask"])
    assert f" {n_bad} with NaN/Inf" in repr(rec)


def test_minus_inf_from_arithmetic_is_counted():
    """-inf the graph computes (log of 0) is no mask, though a where feeds it."""
    class LogZero(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.where(x > 0, x, 0.0) * self.w
            return torch.log(y)

    def fn(model, x):
        return model(x).clamp(min=-1).sum()

    x = torch.tensor([1.0, 0.0, 2.0, 0.0])
    model = LogZero()
    joint = jl.trace(model, fn, {"x": x})
    rec = jl.record(joint, model, {"x": x}, keep_bytes=1 << 20)
    log = next(n.name for n in joint.graph.nodes if _meta.op_name(n) == "log")
    assert int(torch.isinf(rec.values[log]).sum()) == 2
    assert not rec.table.loc[log, "mask"] and rec.layers()["nan/inf"][log] == 2


def test_a_mask_op_holding_nan_or_plus_inf_is_counted():
    """A where with a -inf fill is a mask only while every non-finite element is -inf."""
    class Fill(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.where(x < 0, float("-inf"), x * self.w)

    def fn(model, x):
        return model(x).clamp(min=-1, max=1).sum()

    for bad, col in ((math.nan, "nan"), (math.inf, "inf")):
        x = torch.tensor([bad, 1.0, -5.0])
        model = Fill()
        joint = jl.trace(model, fn, {"x": x})
        rec = jl.record(joint, model, {"x": x}, keep_bytes=1 << 20)
        where = next(n.name for n in joint.graph.nodes if _meta.op_name(n) == "where")
        v = rec.values[where]
        assert int((v == -math.inf).sum()) == 1 and int(torch.isfinite(v).sum()) == 1
        assert not rec.table.loc[where, "mask"], col
        assert rec.layers()["nan/inf"][where] == 2, col


def test_scores_plus_mask_with_more_minus_inf_than_the_mask_is_counted():
    """``scores + mask`` is a mask only while its -inf are exactly the mask's, broadcast."""
    class LogScores(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s = x.shape[-1]
            causal = torch.ones(s, s, dtype=torch.bool).tril()
            mask = torch.where(causal, 0.0, float("-inf"))
            scores = torch.log(torch.relu(x * self.w)).unsqueeze(-2).expand(-1, s, s)
            return torch.softmax(scores + mask, -1)

    def fn(model, x):
        return model(x).nan_to_num().sum()

    x = torch.tensor([[1.0, -2.0, 3.0, 4.0]])  # log(relu(-2)) = -inf: beyond the mask's
    model = LogScores()
    joint = jl.trace(model, fn, {"x": x})
    rec = jl.record(joint, model, {"x": x}, keep_bytes=1 << 20)
    add = next(n.name for n in joint.graph.nodes if _meta.op_name(n) == "add")
    v = rec.values[add]
    mask_inf = 6  # a 4x4 causal mask's strictly upper triangle
    assert int((v == -math.inf).sum()) > mask_inf  # the reference: more than the mask's
    assert not rec.table.loc[add, "mask"]
    assert rec.layers()["nan/inf"][add] == int(torch.isinf(v).sum())
