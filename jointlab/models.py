"""Built-in demo models: a small GPT-2-shaped language model and a DeepSeek-style one.

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


# -- DeepSeek-style: multi-head latent attention (MLA) -------------------------------
def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x`` (..., seq, heads, dim): its two halves rotated."""
    a, b = x.chunk(2, -1)
    cos, sin = cos[: x.shape[1], None], sin[: x.shape[1], None]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


class AttentionCore(nn.Module):
    """Softmax attention of per-head queries over per-head keys plus one shared rotary key.

    ``k_pe`` (batch, seq, 1, rope_dim) is shared by every head: it is expanded to as
    many heads as ``q`` has, which under tensor parallelism is this rank's heads.
    """

    def forward(self, q: torch.Tensor, k_nope: torch.Tensor, v: torch.Tensor,
                k_pe: torch.Tensor) -> torch.Tensor:
        k = torch.cat([k_nope, k_pe.expand(-1, -1, q.shape[2], -1)], -1)
        scores = q.transpose(1, 2) @ k.transpose(1, 2).transpose(2, 3) * q.shape[-1] ** -0.5
        return (scores.softmax(-1) @ v.transpose(1, 2)).transpose(1, 2)


class MLA(nn.Module):
    """DeepSeek-style attention: a low-rank latent kv, and a decoupled rotary key shared by heads.

    ``wkv_a`` projects to the latent (``kv_rank``) and the shared rotary key
    (``rope_dim``); ``wkv_b`` expands the latent to every head's key and value.
    Head counts come from the weights' shapes (``view(..., -1, ...)``), so the
    same code runs on a tensor-parallel rank's local heads.
    """

    def __init__(self, d: int, heads: int, kv_rank: int, nope_dim: int, rope_dim: int,
                 v_dim: int, seq: int) -> None:
        super().__init__()
        self.dims = (kv_rank, nope_dim, rope_dim, v_dim)
        self.wq = nn.Linear(d, heads * (nope_dim + rope_dim), bias=False)
        self.wkv_a = nn.Linear(d, kv_rank + rope_dim, bias=False)
        self.kv_norm = nn.RMSNorm(kv_rank)
        self.wkv_b = nn.Linear(kv_rank, heads * (nope_dim + v_dim), bias=False)
        self.core = AttentionCore()
        self.wo = nn.Linear(heads * v_dim, d, bias=False)
        freqs = 100.0 ** (-torch.arange(rope_dim // 2) / (rope_dim // 2))
        angles = torch.arange(seq)[:, None] * freqs
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        kv_rank, nope, rope, v_dim = self.dims
        q_nope, q_pe = self.wq(x).view(b, t, -1, nope + rope).split([nope, rope], -1)
        q = torch.cat([q_nope, _rotate(q_pe, self.cos, self.sin)], -1)
        kv, k_pe = self.wkv_a(x).split([kv_rank, rope], -1)
        k_pe = _rotate(k_pe.unsqueeze(2), self.cos, self.sin)  # one key for every head
        k_nope, v = self.wkv_b(self.kv_norm(kv)).view(b, t, -1, nope + v_dim).split(
            [nope, v_dim], -1)
        return self.wo(self.core(q, k_nope, v, k_pe).flatten(2))


class DeepSeekBlock(nn.Module):
    """Pre-norm block: MLA and a SwiGLU MLP (``w1``, ``w3`` in, ``w2`` out)."""

    def __init__(self, d: int, heads: int, hidden: int, seq: int) -> None:
        super().__init__()
        self.attn = MLA(d, heads, kv_rank=d // 2, nope_dim=8, rope_dim=4, v_dim=8, seq=seq)
        self.w1, self.w3 = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)
        self.attn_norm, self.ffn_norm = nn.RMSNorm(d), nn.RMSNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class TinyDeepSeek(nn.Module):
    """A tiny DeepSeek-style language model: embedding, MLA blocks, norm, output head."""

    def __init__(self, n_layer: int, d: int, heads: int, vocab: int, seq: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(DeepSeekBlock(d, heads, 2 * d, seq) for _ in range(n_layer))
        self.norm, self.output = nn.RMSNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(input_ids)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def make_tiny_deepseek(n_layer: int = 2, d: int = 32, heads: int = 4, vocab: int = 64,
                       seq: int = 8) -> TinyDeepSeek:
    """Build a tiny DeepSeek-style model (MLA attention), deterministically.

    Args:
        n_layer: Number of blocks.
        d: Model width.
        heads: Attention heads (a tensor-parallel degree must divide it).
        vocab: Vocabulary size.
        seq: Longest sequence (rotary tables).

    Returns:
        The model, in train mode (it has no dropout).
    """
    with _seeded():
        return TinyDeepSeek(n_layer, d, heads, vocab, seq).train()


# Appended rather than listed above: archived graphs record source lines of this file.
__all__ += ["MLA", "DeepSeekBlock", "TinyDeepSeek", "make_tiny_deepseek"]
