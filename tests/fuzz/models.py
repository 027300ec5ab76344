"""Build small models from plain-data specs drawn by tests/fuzz/strategies.py.

A spec is a dict of JSON-like values, so hypothesis prints a readable
reproducer and shrinks it block by block. The hidden state is ``(B, S, D)``
throughout; every block maps it to the same shape.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ACTS = {"gelu": F.gelu, "silu": F.silu, "relu": F.relu}


_NOISE = {
    "randn_like": torch.randn_like,
    "rand_like": torch.rand_like,
    "normal": lambda x: torch.normal(torch.zeros_like(x), torch.ones_like(x)),
    "uniform_": lambda x: torch.empty_like(x).uniform_(-1.0, 1.0),
    "exponential_": lambda x: torch.empty_like(x).exponential_(),
    "bernoulli": lambda x: torch.bernoulli(torch.sigmoid(x.detach())),
}


def _stochastic_depth(x: torch.Tensor, s: dict[str, Any], training: bool) -> torch.Tensor:
    keep = torch.bernoulli(torch.full((x.shape[0], 1, 1), 1 - s["p"], dtype=x.dtype))
    return x * keep / (1 - s["p"]) if training else x


_RANDOM = {  # random ops beyond dropout; each maps (x, spec, training) to x's shape
    "noise": lambda x, s, t: x * (1 + 0.1 * _NOISE[s["op"]](x)),
    "stochastic_depth": _stochastic_depth,
    "rrelu": lambda x, s, t: F.rrelu(x, training=t),
    "shuffle": lambda x, s, t: x[..., torch.randperm(x.shape[-1])],
}


class Block(nn.Module):
    """One spec'd block; ``kind`` selects the computation."""

    def __init__(self, spec: dict[str, Any], d: int, shared: nn.Module) -> None:
        super().__init__()
        self.spec, k = spec, spec["kind"]
        if k == "linear":
            self.fc = nn.Linear(d, d, bias=spec["bias"])
        elif k == "conv1d":
            self.conv = nn.Conv1d(d, d, spec["k"], padding=spec["k"] // 2)
        elif k == "conv2d":
            self.conv = nn.Conv2d(d, d, (spec["k"], 1), padding=(spec["k"] // 2, 0))
        elif k == "batchnorm":
            self.bn = nn.BatchNorm1d(d, affine=spec["affine"])
        elif k == "layernorm":
            self.ln = nn.LayerNorm(d, elementwise_affine=spec["affine"])
        elif k == "attention":
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
        elif k == "dropout":
            self.drop = nn.Dropout(spec["p"])
        elif k == "ema_buffer":
            self.register_buffer("ema", torch.zeros(d))
            self.register_buffer("steps", torch.zeros((), dtype=torch.long))
            self.fc = nn.Linear(d, d)
        elif k == "shared":
            self.inner = shared  # the same module object in several blocks
        elif k == "residual":
            self.body = nn.ModuleList(Block(s, d, shared) for s in spec["body"])
        if spec.get("frozen"):
            for p in self.parameters(recurse=False):
                p.requires_grad_(False)
            for m in self.children():
                if m is not shared:
                    for p in m.parameters(recurse=False):
                        p.requires_grad_(False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        s, k = self.spec, self.spec["kind"]
        if k == "linear":
            return self.fc(x)
        if k == "conv1d":
            return self.conv(x.transpose(1, 2)).transpose(1, 2)
        if k == "conv2d":
            return self.conv(x.permute(0, 2, 1).unsqueeze(-1)).squeeze(-1).permute(0, 2, 1)
        if k == "batchnorm":
            return self.bn(x.transpose(1, 2)).transpose(1, 2)
        if k == "layernorm":
            return self.ln(x)
        if k == "act":
            return ACTS[s["fn"]](x)
        if k == "attention":
            return self._attention(x, mask)
        if k == "dropout":
            return self.drop(x)
        if k == "reshape":
            b, t, d = x.shape
            y = x.reshape(b, t, 2, d // 2).permute(0, 2, 1, 3)
            return (y * 1.5).permute(0, 2, 1, 3).reshape(b, t, d)
        if k == "slice":
            y = torch.cat([x[:, :1] * 0.5, x[:, 1:]], dim=1)
            return torch.cat([y[..., ::2], y[..., 1::2]], dim=-1)
        if k == "where":
            return torch.where(x > 0, x, 0.1 * x)
        if k == "inplace":
            y = x * 1.0
            y.mul_(s["scale"]).add_(0.25)
            return y.relu_() if s["relu"] else y
        if k in _RANDOM:
            return _RANDOM[k](x, s, self.training)
        if k == "ema_buffer":
            with torch.no_grad():
                self.ema.mul_(0.9).add_(0.1 * x.detach().mean(dim=(0, 1)))
                self.steps.add_(1)
            return self.fc(x) + self.ema
        if k == "shared":
            return self.inner(x)
        if k == "residual":
            y = x
            for blk in self.body:
                y = blk(y, mask)
            return x + y
        raise ValueError(f"unknown block kind {k!r}")

    def _attention(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, d = x.shape
        h = self.spec["heads"]
        q, kk, v = self.qkv(x).split(d, dim=-1)
        q, kk, v = (z.reshape(b, t, h, d // h).transpose(1, 2) for z in (q, kk, v))
        masked = self.spec["masked"] and mask is not None
        y = F.scaled_dot_product_attention(
            q, kk, v, attn_mask=mask if masked else None,
            is_causal=self.spec["causal"] and not masked)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class FuzzModel(nn.Module):
    """Embedding or linear stem, spec'd blocks, and a (maybe tied) head."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__()
        d, self.spec = spec["d"], spec
        self.shared = nn.Linear(d, d)
        if spec["tokens"]:
            self.emb = nn.Embedding(spec["vocab"], d)
        else:
            self.stem = nn.Linear(spec["d_in"], d)
        self.blocks = nn.ModuleList(Block(s, d, self.shared) for s in spec["blocks"])
        self.alias = self.blocks[0] if spec["alias_first"] and spec["blocks"] else None
        n_out = spec["vocab"] if spec["tokens"] else spec["d_out"]
        self.head = nn.Linear(d, n_out, bias=not spec["tied"])
        if spec["tokens"] and spec["tied"]:
            self.head.weight = self.emb.weight
        if spec["unused"]:
            self.unused = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.emb(x) if self.spec["tokens"] else self.stem(x)
        for blk in self.blocks:
            h = blk(h, mask)
        if self.alias is not None:  # the first block, reached by a second attribute path
            h = self.alias(h, mask)
        return self.head(h)


def build(spec: dict[str, Any]) -> nn.Module:
    """A model from ``spec``, initialised from ``spec["seed"]``; the global RNG is untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec["seed"])
        model = FuzzModel(spec)
    return model.to(getattr(torch, spec["dtype"])).train()


def make_inputs(spec: dict[str, Any], batch: int) -> dict[str, Any]:
    """Nested inputs for ``spec`` at batch size ``batch`` (private generator)."""
    gen = torch.Generator().manual_seed(spec["seed"] + batch)
    dtype, t = getattr(torch, spec["dtype"]), spec["seq"]
    if spec["tokens"]:
        x = torch.randint(0, spec["vocab"], (batch, t), generator=gen)
        y = torch.randint(0, spec["vocab"], (batch, t), generator=gen)
    else:
        x = torch.randn(batch, t, spec["d_in"], generator=gen, dtype=dtype)
        y = torch.randn(batch, t, spec["d_out"], generator=gen, dtype=dtype)
    keep = torch.rand(batch, 1, t, t, generator=gen) > 0.5
    mask = keep | torch.eye(t, dtype=torch.bool)  # every query sees itself: no empty rows
    batch_dict: dict[str, Any] = {"x": x, "extra": [y]}
    if spec["nested"]:
        batch_dict["extra"].append({"mask": mask, "note": "fuzz"})
    return {"batch": batch_dict, "scale": spec["scale"]}


def train_fn(model: nn.Module, batch: dict[str, Any], scale: float):
    """Loss for a FuzzModel, with a loss_dict."""
    x, y = batch["x"], batch["extra"][0]
    mask = batch["extra"][1]["mask"] if len(batch["extra"]) > 1 else None
    out = model(x, mask)
    if model.spec["tokens"]:
        main = F.cross_entropy(out.flatten(0, 1), y.flatten())
    else:
        main = F.mse_loss(out, y)
    reg = out.pow(2).mean()
    return main + scale * reg, {"main": main, "reg": reg}
