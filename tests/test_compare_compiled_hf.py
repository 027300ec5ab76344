"""Compiled HF attention models: no false MISMATCH from gradients that are zero in exact arithmetic.

A key projection's bias gets no gradient in exact arithmetic (softmax ignores a
constant added to every key); eager and Inductor both return rounding noise
there (1e-11..1e-13), which must not be judged against its own size. The
reference is eager autograd on a copy of the model; a x1.001 error patched
into one Inductor lowering must still come out MISMATCH, named by
``first_divergence``. Two layers, width 32, 16 tokens: one compile each.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

import jointlab as jl
from jointlab import torch_compat
from tests.util import needs_torch, one_thread

transformers = pytest.importorskip("transformers")
aten = torch.ops.aten


def _opt():
    cfg = transformers.OPTConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
        max_position_embeddings=64, word_embed_proj_dim=32, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, layerdrop=0.0, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.OPTForCausalLM(cfg).eval()
    t = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": t[:, :-1].contiguous(), "labels": t[:, 1:].contiguous()}

    def step(m, input_ids, labels):
        logits = m(input_ids=input_ids, use_cache=False).logits
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    return model, inputs, step


def _distilbert():
    cfg = transformers.DistilBertConfig(
        vocab_size=128, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
        max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
        attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.DistilBertForMaskedLM(cfg).eval()
    t = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": t, "labels": t}

    def step(m, input_ids, labels):
        logits = m(input_ids=input_ids).logits
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    return model, inputs, step


@pytest.mark.parametrize("make", [_opt, _distilbert], ids=["opt", "distilbert"])
def test_clean_compile_of_attention_model_compares_ok(make):
    model, inputs, step = make()
    with one_thread():
        c = jl.trace(model, step, inputs).compile("inductor").compare(model, inputs)
    print(c)
    assert c.ok and c.verdict == "within tolerance" and c.first_divergence is None, repr(c)
    assert c.kernels is None  # no kernel blamed
    # the key biases' gradients are rounding noise on both sides, far below their
    # own 1e-5 relative tolerance's reach: judged by what produced them, not by size
    g = c.grads[(c.grads["candidate"] == "inductor") & c.grads["name"].str.contains("k_")
                & c.grads["name"].str.endswith(".bias")]
    assert len(g) == 2 and bool(g["ok"].all()) and float(g["max_abs_err"].max()) < 1e-9, g
    # the graph is held to bitwise equality and says so; the compiled side by tolerance
    assert c.grads[c.grads["candidate"] == "graph"]["exact"].all()
    assert any(n.startswith("the graph") and "bitwise" in n for n in c.notes), c.notes
    assert any(n.startswith("inductor:") and "tolerance" in n for n in c.notes), c.notes


def test_small_lowering_error_in_a_compiled_attention_model_is_named(monkeypatch):
    # erf (GELU) lowered as erf(x) * 1.001: a compiler bug of one part in a thousand
    model, inputs, step = _distilbert()
    lowering = torch_compat.torch_module("torch._inductor.lowering", "inject a wrong lowering")
    erf, mul = lowering.lowerings[aten.erf.default], lowering.lowerings[aten.mul.Tensor]
    monkeypatch.setitem(lowering.lowerings, aten.erf.default, lambda x: mul(erf(x), 1.001))
    with one_thread():
        joint = jl.trace(model, step, inputs)
        bad = joint.compile("inductor")
        bad.run(model, inputs)
        monkeypatch.undo()
        c = bad.compare(model, inputs)
    print(c)
    assert c.verdict == "MISMATCH" and not c.ok, repr(c)
    d = c.first_divergence
    assert d is not None and d.candidate == "inductor" and d.kernel, repr(c)
    first = c.kernels["inductor"].first
    assert d.kernel == first.kernel
    # independent reference: the kernel's own generated code computes an erf
    assert "erf" in first.code, first.code[:400]
    assert "ffn" in d.module or any("ffn" in m for m in first.modules), str(d)


def _gpt2_with_cache():
    # use_cache left at its default: HF's KV cache concatenates the keys onto an empty
    # constant, and Inductor's cat decomposition lays the result out as the keys were
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                  attn_pdrop=0.1, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).train()
    t = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": t[:, :-1].contiguous(), "labels": t[:, 1:].contiguous()}

    def step(m, input_ids, labels):
        logits = m(input_ids=input_ids).logits
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    return model, inputs, step


@needs_torch((2, 13, 0), "inductor compiling GPT-2 with its KV cache like eager (on torch "
             "2.11 the compiled graph differs, wte grad cosine 0.91, and jl.compare says MISMATCH)")
def test_gpt2_with_its_kv_cache_compiles_and_matches_eager():
    model, inputs, step = _gpt2_with_cache()
    with pytest.warns(jl.errors.BakedConstantWarning, match="KV cache"):
        joint = jl.trace(model, step, inputs)
    with one_thread():
        c = joint.compile("inductor").compare(model, inputs)
    assert c.ok and c.verdict == "within tolerance" and c.first_divergence is None, repr(c)
    assert len(c.grads[c.grads["candidate"] == "inductor"]) == len(list(model.parameters()))


def test_a_compile_failure_on_a_kv_cache_value_names_the_traced_constant(monkeypatch):
    # without the repair the view of the cached keys fails inside Inductor's re-trace:
    # the error must blame the baked cache constant, not the user's graph edits
    model, inputs, step = _gpt2_with_cache()
    pipeline = importlib.import_module("jointlab.passes.pipeline")
    monkeypatch.setattr(pipeline, "repair_views", lambda gm: 0)
    with pytest.warns(jl.errors.BakedConstantWarning):
        c = jl.trace(model, step, inputs).compile("inductor")
    with one_thread(), pytest.raises(jl.errors.NodeExecutionError) as err:
        c.run(model, inputs)
    msg = str(err.value)
    assert "Inductor's compile" in msg and "_tensor_constant0 (HF's KV cache" in msg, msg
    assert "use_cache=False" in msg and "if you edited the graph" not in msg, msg
