"""Meta honesty and fake-world figures: math vs fused attention peaks, collective counts,
and a SimpleFSDP-style trace's per-rank memory against FSDP2's FSDPMemTracker."""

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


def _fsdp_vs_tracker():
    """jl.fsdp_memory_check of a 2-layer MLP on 4 fake ranks: FSDP2 eager vs SimpleFSDP trace."""
    import copy

    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    import jointlab as jl
    from tests.test_distributed import _simple_fsdp

    def step(model, x, y):
        return F.mse_loss(model(x), y)

    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(256, 1000), nn.ReLU(), nn.Linear(1000, 256))
    inputs = {"x": torch.randn(64, 256), "y": torch.randn(64, 256)}
    with jl.fake_world(4) as world:
        fsdp = copy.deepcopy(ref)
        for block in (fsdp[0], fsdp[2], fsdp):
            fully_shard(block, mesh=world.mesh)
        measured = jl.track_fsdp_step(fsdp, step, inputs)
        joint = jl.trace(_simple_fsdp(copy.deepcopy(ref), world.mesh), step, inputs)
        return jl.fsdp_memory_check(joint, measured)


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
    check = _fsdp_vs_tracker()
    state = check[check.index.str.startswith("sharded")]
    off = int(state.difference.abs().sum())
    figures = {f"{q} (jointlab/fsdp2 B)": f"{r.jointlab}/{r.fsdp2}" for q, r in check.iterrows()}
    return [
        row("llama d=256 S=1024 on meta (math attention): predicted peak", math_peak / 2**20,
            "MiB"),
        row("same on CPU fakes (jl.fake_cpu, fused attention): predicted peak",
            fused_peak / 2**20, "MiB", "< meta", fused_peak < math_peak),
        row("MLP 256-1000-256, 4 fake ranks: SimpleFSDP trace vs FSDP2 FSDPMemTracker, "
            "sharded param+grad bytes off", off, "B", "== 0", off == 0, **figures),
    ]
