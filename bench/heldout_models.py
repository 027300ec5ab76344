"""Held-out architectures for bench_heldout_compile: tiny, random-init, no downloads.

Each ``make_*`` returns ``(model, inputs, step)`` where ``step(model, **inputs)``
returns a scalar loss. None of these families is used in tests/ or
jointlab/models.py: a ResNet of residual conv+BatchNorm blocks (HF ResNet), a
2-level U-Net with skip connections, BART (seq2seq, ``use_cache=False``), a
Qwen2-MoE (top-2 router), a hand-scanned GRU cell, DeiT, a MobileViT-shaped
conv+attention net and SegFormer (HF MobileViT, ``make_mobilevit``, is kept out
of the suite: its ~2,500-node graph compiles for over 10 minutes here). Widths
8-32, one or two layers, 16-32 pixel images, 8-12 tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Made = tuple[nn.Module, dict[str, Any], Callable[..., torch.Tensor]]


def _gen(seed: int = 1) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _classify(m: nn.Module, pixel_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(m(pixel_values=pixel_values).logits, labels)


def _images(size: int, classes: int, channels: int = 3) -> dict[str, Any]:
    g = _gen()
    return {"pixel_values": torch.randn(2, channels, size, size, generator=g),
            "labels": torch.randint(0, classes, (2,), generator=g)}


def make_resnet_bn() -> Made:
    """HF ResNet (basic blocks, conv -> BatchNorm -> ReLU with residuals), train mode."""
    import transformers
    cfg = transformers.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16],
                                    depths=[1, 1], layer_type="basic", num_labels=4)
    torch.manual_seed(0)
    return transformers.ResNetForImageClassification(cfg).train(), _images(32, 4), _classify


class _Double(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class UNet(nn.Module):
    """Two-level U-Net: max-pool down, transposed-conv up, skip connections by concat."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.down1, self.down2, self.mid = _Double(1, c), _Double(c, 2 * c), _Double(2 * c, 4 * c)
        self.up2, self.dec2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2), _Double(4 * c, 2 * c)
        self.up1, self.dec1 = nn.ConvTranspose2d(2 * c, c, 2, stride=2), _Double(2 * c, c)
        self.head = nn.Conv2d(c, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s1 = self.down1(x)
        s2 = self.down2(F.max_pool2d(s1, 2))
        m = self.mid(F.max_pool2d(s2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), s2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), s1], dim=1))
        return self.head(d1)


def make_unet() -> Made:
    """The U-Net above on 16x16 single-channel images, a BCE segmentation loss."""
    torch.manual_seed(0)
    g = _gen()
    inputs = {"x": torch.randn(2, 1, 16, 16, generator=g),
              "mask": (torch.rand(2, 1, 16, 16, generator=g) > 0.5).float()}

    def step(m: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(m(x), mask)
    return UNet().train(), inputs, step


def make_bart() -> Made:
    """HF BART encoder-decoder, one layer each, width 16, ``use_cache=False``."""
    import transformers
    cfg = transformers.BartConfig(
        vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=32, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, use_cache=False, attn_implementation="eager")
    torch.manual_seed(0)
    g = _gen()
    inputs = {"input_ids": torch.randint(3, 64, (2, 10), generator=g),
              "labels": torch.randint(3, 64, (2, 8), generator=g)}

    def step(m: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return m(input_ids=input_ids, labels=labels, use_cache=False).loss
    return transformers.BartForConditionalGeneration(cfg).eval(), inputs, step


def _lm_inputs(vocab: int, seq: int = 8) -> dict[str, Any]:
    t = torch.randint(0, vocab, (2, seq + 1), generator=_gen())
    return {"input_ids": t[:, :-1].contiguous(), "labels": t[:, 1:].contiguous()}


def _lm_step(m: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = m(input_ids=input_ids, use_cache=False).logits
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def make_qwen2_moe() -> Made:
    """HF Qwen2-MoE: 4 experts, top-2 routing plus a shared expert, one layer, width 16."""
    import transformers
    cfg = transformers.Qwen2MoeConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        max_position_embeddings=32, use_cache=False, attn_implementation="eager",
        experts_implementation="batched_mm")
    torch.manual_seed(0)
    return transformers.Qwen2MoeForCausalLM(cfg).eval(), _lm_inputs(64), _lm_step


class GRUScan(nn.Module):
    """Embedding -> a GRU cell scanned by hand over time -> per-step classifier."""

    def __init__(self, vocab: int = 32, d: int = 16) -> None:
        super().__init__()
        self.emb, self.cell, self.head = nn.Embedding(vocab, d), nn.GRUCell(d, d), nn.Linear(d, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        h = x.new_zeros(x.shape[0], x.shape[2])
        outs = []
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
            outs.append(h)
        return self.head(torch.stack(outs, dim=1))


def make_gru_scan() -> Made:
    """The hand-scanned GRU above over 6 steps, a per-step tagging loss."""
    torch.manual_seed(0)
    g = _gen()
    inputs = {"tokens": torch.randint(0, 32, (2, 6), generator=g),
              "tags": torch.randint(0, 4, (2, 6), generator=g)}

    def step(m: nn.Module, tokens: torch.Tensor, tags: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(tokens).flatten(0, 1), tags.flatten())
    return GRUScan().train(), inputs, step


def make_deit() -> Made:
    """HF DeiT (vision transformer with a distillation token), one layer, width 16."""
    import transformers
    cfg = transformers.DeiTConfig(
        image_size=16, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=4, attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.DeiTForImageClassification(cfg).eval(), _images(16, 4), _classify


def _cbs(cin: int, cout: int, k: int = 1, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.SiLU())


class MobileViTish(nn.Module):
    """MobileViT's shape, small: a conv stem, an inverted residual (depthwise) block, and a
    block that unfolds 2x2 patches, runs a transformer layer over them and folds back."""

    def __init__(self, c: int = 8, d: int = 16, p: int = 2) -> None:
        super().__init__()
        self.p = p
        self.stem = _cbs(3, c, 3, 2)
        self.expand, self.dw = _cbs(c, 2 * c), _cbs(2 * c, 2 * c, 3, groups=2 * c)
        self.reduce = nn.Sequential(nn.Conv2d(2 * c, c, 1, bias=False), nn.BatchNorm2d(c))
        self.local, self.to_d = _cbs(c, c, 3), nn.Conv2d(c, d, 1, bias=False)
        self.transformer = nn.TransformerEncoderLayer(d, 2, 2 * d, dropout=0.0,
                                                      activation="gelu", batch_first=True,
                                                      norm_first=True)
        self.from_d, self.fuse = _cbs(d, c), _cbs(2 * c, c, 3)
        self.head = nn.Linear(c, 4)

    def _global(self, x: torch.Tensor) -> torch.Tensor:
        b, d, h, w = x.shape
        p = self.p
        patches = x.reshape(b, d, h // p, p, w // p, p).permute(0, 3, 5, 2, 4, 1)
        y = self.transformer(patches.reshape(b * p * p, (h // p) * (w // p), d))
        y = y.reshape(b, p, p, h // p, w // p, d).permute(0, 5, 3, 1, 4, 2)
        return y.reshape(b, d, h, w)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.stem(pixel_values)
        x = x + self.reduce(self.dw(self.expand(x)))
        y = self.from_d(self._global(self.to_d(self.local(x))))
        x = self.fuse(torch.cat([x, y], dim=1))
        return self.head(x.mean(dim=(2, 3)))


def make_mobilevit_ish() -> Made:
    """The MobileViT-shaped net above on 16x16 images, train mode (BatchNorm batch stats)."""
    torch.manual_seed(0)
    inputs = _images(16, 4)

    def step(m: nn.Module, pixel_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(pixel_values), labels)
    return MobileViTish().train(), inputs, step


def make_mobilevit() -> Made:
    """HF MobileViT: inverted residual convs with BatchNorm plus transformer blocks, train mode."""
    import transformers
    cfg = transformers.MobileViTConfig(
        image_size=32, patch_size=2, num_channels=3, hidden_sizes=[16, 16, 16],
        neck_hidden_sizes=[8, 8, 16, 16, 16, 16, 32], num_attention_heads=2, mlp_ratio=2.0,
        expand_ratio=2.0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        classifier_dropout_prob=0.0, num_labels=4)
    torch.manual_seed(0)
    return transformers.MobileViTForImageClassification(cfg).train(), _images(32, 4), _classify


def make_segformer() -> Made:
    """HF SegFormer: overlapping patch embeds, efficient attention, Mix-FFN, MLP decode head."""
    import transformers
    cfg = transformers.SegformerConfig(
        num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
        hidden_sizes=[8, 16], patch_sizes=[3, 3], strides=[2, 2], num_attention_heads=[1, 2],
        mlp_ratios=[2, 2], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        classifier_dropout_prob=0.0, drop_path_rate=0.0, decoder_hidden_size=16, num_labels=3)
    torch.manual_seed(0)
    g = _gen()
    inputs = {"pixel_values": torch.randn(2, 3, 32, 32, generator=g),
              "labels": torch.randint(0, 3, (2, 32, 32), generator=g)}

    def step(m: nn.Module, pixel_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return m(pixel_values=pixel_values, labels=labels).loss
    return transformers.SegformerForSemanticSegmentation(cfg).train(), inputs, step


MODELS: dict[str, Callable[[], Made]] = {
    "resnet_bn (HF ResNet)": make_resnet_bn,
    "unet": make_unet,
    "bart (seq2seq)": make_bart,
    "qwen2_moe (MoE)": make_qwen2_moe,
    "gru_scan (recurrent)": make_gru_scan,
    "deit (ViT)": make_deit,
    "mobilevit_ish (conv+attention)": make_mobilevit_ish,
    "segformer": make_segformer,
}
