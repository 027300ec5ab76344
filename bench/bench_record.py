"""Recording cost: jl.record (statistics of every value) vs one joint.run, same process.

Subjects nobody here wrote: transformers' ConvNeXt (image classifier), OPT (causal
LM) and DistilBERT (masked LM), random-init at small widths, plus the 4-layer
GPT-2-shaped LM; and the small models a class or a quick debugging run uses
(issue 45), where the per-node cost of recording dominates: HF GPT-2 (2 layers,
d=128, 2x16 tokens) and Falcon (2 layers, d=32), a conv+BatchNorm CNN, a
two-level U-Net and notebook 05's tiny MLPs. All at one intra-op thread. Each pair
is timed alternately, best of 7 (21 for the small ones, 15 for GPT-2), in CPU time
of this process (one thread: the work done, not the other processes on a shared
machine); the target is ``jl.record`` <= 2x ``joint.run``. The statistics are
computed during the step; ``Record.table`` lays them out as a DataFrame on first
read, so each row also gives the ratio with that first read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _convnext() -> tuple[Any, Any, dict[str, Any]]:
    import transformers as tr

    from tests.fixtures.real import image_train_fn

    cfg = tr.ConvNextConfig(num_channels=3, patch_size=4, num_stages=4, depths=[1, 1, 2, 1],
                            hidden_sizes=[24, 48, 96, 192], image_size=64, num_labels=10)
    torch.manual_seed(0)
    model = tr.ConvNextForImageClassification(cfg).train()
    inputs = {"pixel_values": torch.randn(4, 3, 64, 64), "labels": torch.randint(0, 10, (4,))}
    return model, image_train_fn, inputs


def _opt() -> tuple[Any, Any, dict[str, Any]]:
    import transformers as tr

    from tests.fixtures.real import lm_train_fn

    cfg = tr.OPTConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, ffn_dim=256, word_embed_proj_dim=64,
                       max_position_embeddings=128, dropout=0.1, attention_dropout=0.1)
    torch.manual_seed(0)
    model = tr.OPTForCausalLM(cfg).train()
    ids = torch.randint(0, 512, (4, 64))
    return model, lm_train_fn, {"input_ids": ids, "labels": ids.clone()}


def _distilbert() -> tuple[Any, Any, dict[str, Any]]:
    import transformers as tr

    from tests.fixtures.real import mlm_train_fn

    cfg = tr.DistilBertConfig(vocab_size=512, dim=64, n_layers=2, n_heads=4, hidden_dim=256,
                              max_position_embeddings=128)
    torch.manual_seed(0)
    model = tr.DistilBertForMaskedLM(cfg).train()
    ids = torch.randint(0, 512, (4, 64))
    mask = torch.ones(4, 64, dtype=torch.int64)
    mask[0, -8:] = 0
    labels = torch.full((4, 64), -100)
    labels[:, ::5] = ids[:, ::5]
    return model, mlm_train_fn, {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _gpt2_small() -> tuple[Any, Any, dict[str, Any]]:
    import transformers as tr

    from tests.fixtures.real import lm_train_fn

    cfg = tr.GPT2Config(vocab_size=256, n_embd=128, n_layer=2, n_head=4, n_positions=32)
    torch.manual_seed(0)
    model = tr.GPT2LMHeadModel(cfg).train()
    ids = torch.randint(0, 256, (2, 16))
    return model, lm_train_fn, {"input_ids": ids, "labels": ids.clone()}


def _falcon() -> tuple[Any, Any, dict[str, Any]]:
    from tests.fixtures.real import lm_train_fn
    from tests.fixtures.view_models import tiny_falcon

    model = tiny_falcon()
    ids = torch.randint(0, 64, (2, 16))
    return model, lm_train_fn, {"input_ids": ids, "labels": ids.clone()}


class _SmallCNN(nn.Module):
    """conv-BN-ReLU x3 with pooling, then a linear head: a class's first CNN."""

    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for cout in (width, 2 * width, 4 * width):
            layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                       nn.ReLU(), nn.MaxPool2d(2)]
            cin = cout
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


def _conv(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())


class _UNet(nn.Module):
    """A two-level U-Net: down, bottleneck, up with skip concatenation, per-pixel logits."""

    def __init__(self, width: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.down1, self.down2 = _conv(3, width), _conv(width, 2 * width)
        self.mid = _conv(2 * width, 4 * width)
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = _conv(4 * width, 2 * width)
        self.up1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec1 = _conv(2 * width, width)
        self.out = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d1 = self.down1(x)
        d2 = self.down2(F.max_pool2d(d1, 2))
        m = self.mid(F.max_pool2d(d2, 2))
        u2 = self.dec2(torch.cat([self.up2(m), d2], 1))
        return self.out(self.dec1(torch.cat([self.up1(u2), d1], 1)))


def _image(model: nn.Module, size: int, batch: int = 4) -> tuple[Any, Any, dict[str, Any]]:
    def train_fn(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(images), labels)

    torch.manual_seed(0)
    x = torch.randn(batch, 3, size, size)
    out = model(x)
    labels = torch.randint(0, out.shape[1], (batch, *out.shape[2:]))
    return model.train(), train_fn, {"images": x, "labels": labels}


class _MLP(nn.Module):
    """Notebook 05's network on the board: x -> fc1 -> tanh -> fc2."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(3, width), nn.Tanh(), nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _mlp(width: int, batch: int) -> Callable[[], tuple[Any, Any, dict[str, Any]]]:
    def make() -> tuple[Any, Any, dict[str, Any]]:
        def train_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.mse_loss(model(x), y)

        torch.manual_seed(0)
        return _MLP(width), train_fn, {"x": torch.randn(batch, 3), "y": torch.randn(batch, 1)}
    return make


SUBJECTS = {"ConvNeXt 4-stage w24-192 64px b4": _convnext,
            "OPT 2L d64 seq64 b4": _opt,
            "DistilBERT 2L d64 seq64 b4": _distilbert,
            "HF GPT-2 2L d128 2x16": _gpt2_small,
            "HF Falcon 2L d32 2x16": _falcon,
            "conv+BN CNN w16 32px b4": lambda: _image(_SmallCNN(), 32),
            "U-Net 2-level w8 32px b4": lambda: _image(_UNet(), 32),
            "MLP (nb 05) w4 b5": _mlp(4, 5),
            "MLP (nb 05) w512 b5": _mlp(512, 5)}


def _ratio(joint, model, inputs, repeat: int) -> tuple[float, dict[str, float]]:
    from run import interleaved

    import jointlab as jl

    t = interleaved({"run": lambda: joint.run(model, inputs),
                     "record": lambda: jl.record(joint, model, inputs),
                     "record+table": lambda: jl.record(joint, model, inputs).table},
                    repeat, stat=min, clock=time.process_time)
    return t["record"] / t["run"], t


def rows(ctx):
    from run import row

    import jointlab as jl
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2
    from tests.util import one_thread

    out = []
    for k, (name, make) in enumerate(SUBJECTS.items()):
        model, fn, inputs = make()
        joint = jl.trace(model, fn, inputs)
        reps = 7 if k < 3 else 21  # the small ones take milliseconds: more samples
        with one_thread():
            ratio, t = _ratio(joint, model, inputs, 3 if ctx.quick else reps)
        out.append(row(f"{name}: jl.record / joint.run", ratio, "x", "<= 2", ratio <= 2,
                       detail=f"{len(joint.graph.nodes)} nodes, joint.run "
                       f"{t['run'] * 1e3:.1f} ms CPU, best of {reps}, one thread; with the "
                       f"first .table read {t['record+table'] / t['run']:.2f}x"))
    model, inputs = make_gpt2(n_layer=4, d=256), lm_inputs(2, 1024, 64)
    joint = jl.trace(model, lm_train_fn, inputs)
    with one_thread():
        ratio, t = _ratio(joint, model, inputs, 5 if ctx.quick else 15)
    out.append(row("gpt2-4L d256: jl.record / joint.run", ratio, "x", "<= 2", ratio <= 2,
                   detail=f"{len(joint.graph.nodes)} nodes, joint.run {t['run'] * 1e3:.0f} ms, "
                   f"one thread; with the first .table read {t['record+table'] / t['run']:.2f}x"))
    return out
