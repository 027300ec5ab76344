"""Recording cost: jl.record (statistics of every value) vs one joint.run, same process.

Subjects nobody here wrote: transformers' ConvNeXt (image classifier), OPT (causal
LM) and DistilBERT (masked LM), random-init at small widths, plus the 4-layer
GPT-2-shaped LM, all at one intra-op thread. Each pair is timed alternately, best
of 7 (of 15 for GPT-2), in CPU time of this process (one thread: the work done,
not the other processes on a shared machine); the target is ``jl.record`` <= 2x
``joint.run``.
"""

from __future__ import annotations

import time
from typing import Any

import torch


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


SUBJECTS = {"ConvNeXt 4-stage w24-192 64px b4": _convnext,
            "OPT 2L d64 seq64 b4": _opt,
            "DistilBERT 2L d64 seq64 b4": _distilbert}


def _ratio(joint, model, inputs, repeat: int) -> tuple[float, dict[str, float]]:
    from run import interleaved

    import jointlab as jl

    t = interleaved({"run": lambda: joint.run(model, inputs),
                     "record": lambda: jl.record(joint, model, inputs)}, repeat, stat=min,
                    clock=time.process_time)
    return t["record"] / t["run"], t


def rows(ctx):
    from run import row

    import jointlab as jl
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2
    from tests.util import one_thread

    out = []
    for name, make in SUBJECTS.items():
        model, fn, inputs = make()
        joint = jl.trace(model, fn, inputs)
        with one_thread():
            ratio, t = _ratio(joint, model, inputs, 3 if ctx.quick else 7)
        out.append(row(f"{name}: jl.record / joint.run", ratio, "x", "<= 2", ratio <= 2,
                       detail=f"{len(joint.graph.nodes)} nodes, joint.run "
                       f"{t['run'] * 1e3:.1f} ms CPU, best of 7, one thread"))
    model, inputs = make_gpt2(n_layer=4, d=256), lm_inputs(2, 1024, 64)
    joint = jl.trace(model, lm_train_fn, inputs)
    with one_thread():
        ratio, t = _ratio(joint, model, inputs, 5 if ctx.quick else 15)
    out.append(row("gpt2-4L d256: jl.record / joint.run", ratio, "x", "<= 2", ratio <= 2,
                   detail=f"{len(joint.graph.nodes)} nodes, joint.run {t['run'] * 1e3:.0f} ms, "
                   "one thread"))
    return out
