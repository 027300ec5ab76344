"""Built-in demo models: a small GPT-2-shaped language model.

Used by ``jointlab demo``, the notebooks and the benchmarks. Construction is
deterministic and leaves the caller's global RNG state untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPT", "CausalSelfAttention", "GPTBlock", "lm_inputs", "lm_train_fn", "make_gpt2"]

MODEL_SEED = 1234
INPUT_SEED = 4321


@contextmanager
def _seeded(seed: int = MODEL_SEED) -> Iterator[None]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``F.scaled_dot_product_attention``.

    Dropout is applied to the output projection with an ``nn.Dropout`` module;
    attention-probability dropout (``dropout_p`` of SDPA) is off by default.
    """

    def __init__(
        self, d: int, n_head: int, dropout: float = 0.1, attn_dropout: float = 0.0
    ) -> None:
        super().__init__()
        if d % n_head != 0:
            raise ValueError(f"d={d} is not divisible by n_head={n_head}")
        self.n_head = n_head
        self.attn_dropout = attn_dropout
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            dropout_p=self.attn_dropout if self.training else 0.0,
            is_causal=True,
        )
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.proj(y))


class GPTBlock(nn.Module):
    """Pre-LayerNorm transformer block: causal attention and a GELU MLP, with residuals."""

    def __init__(
        self, d: int, n_head: int, dropout: float = 0.1, attn_dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_head, dropout, attn_dropout)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(
            nn.Linear(d, 4 * d),
            nn.GELU(),
            nn.Linear(4 * d, d),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2-style language model with a tied input embedding and LM head."""

    def __init__(
        self,
        *,
        n_layer: int,
        d: int,
        n_head: int,
        vocab: int,
        seq: int,
        dropout: float = 0.1,
        attn_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.vocab = vocab
        self.seq = seq
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(GPTBlock(d, n_head, dropout, attn_dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.apply(self._init_weights)
        self.lm_head.weight = self.wte.weight  # tied: one Parameter, two attribute paths

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        if t > self.seq:
            raise ValueError(f"sequence length {t} exceeds the model's {self.seq}")
        pos = torch.arange(t, device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def make_gpt2(
    n_layer: int = 12,
    d: int = 256,
    n_head: int = 4,
    vocab: int = 1024,
    seq: int = 64,
    dropout: float = 0.1,
) -> GPT:
    """Build a GPT-2-shaped model in train mode, deterministically."""
    with _seeded():
        model = GPT(n_layer=n_layer, d=d, n_head=n_head, vocab=vocab, seq=seq, dropout=dropout)
        return model.train()


def lm_train_fn(model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of a language model."""
    logits = model(input_ids)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def lm_inputs(batch_size: int, vocab: int, seq: int, seed: int = INPUT_SEED) -> dict[str, Any]:
    """Random next-token-prediction inputs: ``input_ids`` and ``labels`` (shifted by one)."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch_size, seq + 1), generator=gen)
    return {
        "input_ids": tokens[:, :-1].contiguous(),
        "labels": tokens[:, 1:].contiguous(),
    }
