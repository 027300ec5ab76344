"""Models, cases and step helpers of ``bench/gpu_check.py`` (its checks: ``gpu_check_items``).

A tiny HF GPT-2 (random init, ``use_cache=False``, dropout 0.1 as configured by default)
and a conv+BatchNorm net written here (torchvision does not load on the dev machines),
each built on the device; a :class:`Case` is one of them traced in one mode.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from jointlab import torch_compat
from jointlab.meta import graph_draws_random

SEED = 3
SCALE = 1.001  # the injected bugs' factor, as bench/inject.py's
KEEP_BYTES = 1 << 30  # jl.record keeps every value of these tiny models


class Skip(Exception):
    """A check that does not apply here; its message says why."""


# -- models ---------------------------------------------------------------------------
def gpt2_step(model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """HF causal-LM loss."""
    return model(input_ids=input_ids, labels=labels).loss


def gpt2(device: torch.device) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Tiny HF GPT-2, random init, train mode (dropout 0.1 as configured by default)."""
    import transformers

    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128,
                                  n_positions=32, use_cache=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    return model.train().to(device), {"input_ids": ids.to(device),
                                      "labels": ids.clone().to(device)}


class ConvBN(nn.Module):
    """3x3 conv, BatchNorm, in-place ReLU."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        """Channels in and out."""
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """conv -> bn -> relu."""
        return self.act(self.bn(self.conv(x)))


class SmallCNN(nn.Module):
    """Stem, a strided block, a residual block, global average pool, linear head."""

    def __init__(self, classes: int = 10) -> None:
        """Widths 8-16."""
        super().__init__()
        self.stem, self.block1, self.block2 = ConvBN(3, 8), ConvBN(8, 16, 2), ConvBN(16, 16)
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits."""
        x = self.block1(self.stem(x))
        x = x + self.block2(x)
        return self.head(x.mean((2, 3)))


def cnn_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the CNN's logits."""
    return F.cross_entropy(model(x), y)


def cnn(device: torch.device) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The conv+BatchNorm net (no random op: its compiled run is comparable on any torch)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = SmallCNN()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)
    return model.train().to(device), {"x": x.to(device), "y": y.to(device)}


#: name -> (build, train_fn, breakpoint module, module whose output the graph bug scales)
MODELS = {"gpt2": (gpt2, gpt2_step, "transformer.h.1.mlp", "transformer.h.1.mlp.c_fc"),
          "cnn": (cnn, cnn_step, "block2", "block2.conv")}


@dataclass
class Case:
    """One model traced in one mode on one device, and what the checks pass on."""

    name: str
    mode: str
    device: torch.device
    model: Any = None  # built by check_trace (a failed build is that check's result)
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    joint: Any = None
    compiled: Any = None
    want: Any = None  # c.run under SEED

    def __post_init__(self) -> None:
        """Name the model's train_fn and modules (building it is check_trace's)."""
        self.build, self.train_fn, self.bp_module, self.inject_module = MODELS[self.name]

    def fresh(self) -> nn.Module:
        """A copy of the model (runs update BatchNorm's buffers)."""
        return copy.deepcopy(self.model)


# -- helpers --------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    """Wait for the device."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_of(fn: Any, device: torch.device, k: int = 5) -> float:
    """Best wall time of ``k`` calls after one warm-up, synchronized."""
    fn()
    sync(device)
    best = math.inf
    for _ in range(k):
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def values_of(result: Any, model: nn.Module | None = None) -> dict[str, torch.Tensor]:
    """Loss, grads (and the model's buffers) of one step, by name."""
    d = {"loss": result.loss.detach()}
    d.update({f"grad {k}": v for k, v in result.grads.items()})
    if model is not None:
        d.update({f"buffer {k}": b.detach().clone() for k, b in model.named_buffers()})
    return d


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference, in float64 (NaN where shapes differ)."""
    if a.shape != b.shape:
        return math.nan
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def not_bitwise(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]
                ) -> dict[str, float]:
    """Names whose values are not bitwise equal (or missing on one side), with max abs diff."""
    out = {k: math.nan for k in set(got) ^ set(want)}
    out.update({k: max_abs(got[k], want[k]) for k in want
                if k in got and not torch.equal(got[k], want[k])})
    return out


def eager_step(case: Case, seed: int) -> dict[str, torch.Tensor]:
    """One eager autograd step on a copy of the model from ``seed``."""
    m = case.fresh()
    torch.manual_seed(seed)
    loss = case.train_fn(m, **case.inputs)
    loss.backward()
    d = {"loss": loss.detach()}
    d.update({f"grad {n}": p.grad if p.grad is not None else torch.zeros_like(p)
              for n, p in m.named_parameters()})
    d.update({f"buffer {k}": b.detach().clone() for k, b in m.named_buffers()})
    return d


def short(diffs: dict[str, float], n: int = 4) -> str:
    """The ``n`` largest differences, one string."""
    top = sorted(diffs.items(), key=lambda kv: -kv[1] if kv[1] == kv[1] else -math.inf)[:n]
    more = f" (+{len(diffs) - n} more)" if len(diffs) > n else ""
    return ", ".join(f"{k} {v:.2e}" for k, v in top) + more


def known_random_limit(case: Case, c: Any) -> bool:
    """A compiled candidate's MISMATCH on torch < 2.13 with random ops (README, versions)."""
    d = c.first_divergence
    return (not torch_compat.FALLBACK_RANDOM_DRAWS_EAGER and graph_draws_random(case.joint.graph)
            and c.verdict == "MISMATCH" and d is not None and d.candidate != "graph")


