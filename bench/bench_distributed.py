"""Meta honesty and fake-world figures: math vs fused attention peaks, collective counts."""

from __future__ import annotations

import warnings

from run import row


def _llama():
    import torch
    import transformers as tr

    cfg = tr.LlamaConfig(vocab_size=96, hidden_size=256, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=4, intermediate_size=512,
                         max_position_embeddings=2048)
    with torch.device("meta"):
        return tr.AutoModelForCausalLM.from_config(cfg).train()


def _ce(model, input_ids, labels):
    import torch.nn.functional as F

    logits = model(input_ids=input_ids, use_cache=False).logits
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def rows(ctx):
    import torch

    import jointlab as jl

    model = _llama()
    ids = torch.randint(0, 96, (2, 1024))
    inputs = {"input_ids": ids, "labels": ids.clone()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jl.errors.MetaAttentionWarning)
        math_peak = jl.trace(model, _ce, inputs).memory().peak_bytes
    with jl.fake_cpu():
        fused_peak = jl.trace(model, _ce, inputs).memory().peak_bytes
    return [
        row("llama d=256 S=1024 on meta (math attention): predicted peak", math_peak / 2**20,
            "MiB"),
        row("same on CPU fakes (jl.fake_cpu, fused attention): predicted peak",
            fused_peak / 2**20, "MiB", "< meta", fused_peak < math_peak),
    ]
