"""HF transformers models in both tracing modes, against eager autograd.

Covers the transformers plug-in (:mod:`jointlab.plugins.transformers`), dynamic
shapes on HF causal LMs, memory at a non-traced size, MoE refusals and the
baked-constant warnings HF models give.
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

import jointlab as jl
from jointlab.plugins import transformers as _hf_compat
from jointlab.torch_compat import release
from tests.fixtures import real
from tests.util import (
    assert_unchanged,
    deep_state,
    eager_step,
    needs_torch,
    one_thread,
    traced_real,
)

pytest.importorskip("transformers")

HF = ["hf_gpt2", "hf_llama", "hf_mistral", "hf_qwen2", "hf_bert", "hf_t5", "hf_vit",
      "hf_mixtral", "hf_gpt2_checkpoint"]
MODES = ["make_fx", "aot"]
@pytest.fixture(autouse=True)
def _one_thread():
    """Mixtral's eager expert backward differs run to run with several CPU threads."""
    with one_thread():
        yield


def _assert_exact(got, want, model, ref) -> None:
    """Loss, every gradient, the loss_dict and every buffer equal eager's bit for bit."""
    (loss, grads, ld), (eloss, egrads, eld) = got, want
    assert torch.equal(loss, eloss), (loss, eloss)
    assert list(grads) == list(egrads)
    for k in grads:
        assert torch.equal(grads[k], egrads[k]), k
    assert list(ld) == list(eld)
    for k in ld:
        assert torch.equal(ld[k], eld[k]), k
    for (k, a), (k2, b) in zip(model.named_buffers(), ref.named_buffers(), strict=True):
        assert k == k2 and torch.equal(a, b), k


def _sgd(model, grads) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in grads:
                p.sub_(0.5 * grads[name])


def _two_steps(joint, fixture, inputs, model, ref) -> None:
    for step in range(2):
        torch.manual_seed(7 + step)
        got = joint.run(model, inputs)
        want = eager_step(ref, fixture.train_fn, inputs, seed=7 + step)
        _assert_exact(got, want, model, ref)
        _sgd(model, got[1])
        _sgd(ref, want[1])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", HF)
def test_hf_fixture_matches_eager_exactly(name, mode):
    f = real.get(name)
    model, ref, inputs = f.make_model(), f.make_model(), f.make_inputs(2)
    before = deep_state(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        joint = jl.trace(model, f.train_fn, inputs, mode=mode)
    # The fixtures call the model with use_cache=False: nothing to act on, no warning.
    assert [str(w.message) for w in caught if w.category is jl.errors.BakedConstantWarning] == []
    assert_unchanged(before, model)
    _two_steps(joint, f, inputs, model, ref)


# -- the AOT compatibility shim ------------------------------------------------------------
def _import_utils():
    return sys.modules["transformers.utils.import_utils"]


def _tiny_gpt2():
    return real.get("hf_gpt2").make_model(), real.lm_inputs()


def test_aot_shim_active_only_during_the_export():
    from transformers.utils.import_utils import is_tracing

    original = _import_utils().is_fake_tensor
    seen: list[tuple[bool, bool]] = []

    def train_fn(model, input_ids, labels):
        seen.append((is_tracing(input_ids), _import_utils().is_fake_tensor is original))
        return real.lm_train_fn(model, input_ids, labels)

    model, inputs = _tiny_gpt2()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jl.trace(model, train_fn, inputs, mode="aot")
    assert seen and all(tracing and not orig for tracing, orig in seen)
    assert _import_utils().is_fake_tensor is original
    # Outside the export a FunctionalTensor-free tensor is not "tracing".
    assert not is_tracing(inputs["input_ids"])


def test_aot_shim_restored_after_a_failing_trace():
    original = _import_utils().is_fake_tensor
    seen: list[bool] = []

    def train_fn(model, input_ids, labels):
        seen.append(_import_utils().is_fake_tensor is original)
        loss = real.lm_train_fn(model, input_ids, labels)
        if loss > 0:  # data-dependent: the trace fails here
            return loss
        return loss

    model, inputs = _tiny_gpt2()
    before = deep_state(model)
    with pytest.raises(jl.errors.DataDependentError):
        jl.trace(model, train_fn, inputs, mode="aot")
    assert seen == [False]
    assert _import_utils().is_fake_tensor is original
    assert_unchanged(before, model)


def test_aot_shim_without_transformers_imports_nothing():
    import subprocess

    code = (
        "import sys, torch, jointlab as jl\n"
        "from tests.fixtures import zoo\n"
        "f = zoo.get('mlp')\n"
        "jl.trace(f.make_model(), f.train_fn, f.make_inputs(2), mode='aot')\n"
        "assert 'transformers' not in sys.modules, 'jointlab imported transformers'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_is_functional_fake_rejects_plain_and_fake_tensors():
    from torch._subclasses import FakeTensorMode

    assert not _hf_compat.is_functional_fake(torch.ones(2))
    with FakeTensorMode() as mode:
        assert not _hf_compat.is_functional_fake(mode.from_tensor(torch.ones(2)))


# -- dynamic shapes on HF causal LMs -------------------------------------------------------
DYN = [{"dynamic": True},
       {"dynamic_arg_dims": {"input_ids": [0, 1], "labels": [0, 1]}}]


@pytest.mark.parametrize("how", [0, 1], ids=["dynamic", "arg_dims"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["hf_gpt2", "hf_llama"])
def test_dynamic_causal_lm_runs_exactly_at_other_sizes(name, mode, how):
    f = real.get(name)
    model, ref = f.make_model(), f.make_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        joint = jl.trace(model, f.train_fn, real.lm_inputs(2, 8), mode=mode, **DYN[how])
    for batch, seq in [(3, 5), (2, 12)]:
        inputs = real.lm_inputs(batch, seq)
        torch.manual_seed(3)
        got = joint.run(model, inputs)
        want = eager_step(ref, f.train_fn, inputs, seed=3)
        _assert_exact(got, want, model, ref)


def test_specialized_dim_advice_is_true_for_sizes_above_one():
    from tests.fixtures import zoo

    f = zoo.get("mlp")

    def train_fn(model, x, y):
        n = int(x.shape[0])  # pins the batch size to its traced value
        return f.train_fn(model, x[:n], y)

    model = f.make_model()
    joint = jl.trace(model, train_fn, f.make_inputs(4), dynamic=True)
    with pytest.raises(jl.errors.GuardError, match="specialized to 4") as info:
        joint.run(model, f.make_inputs(3))
    msg = str(info.value)
    assert ">= 2" not in msg and "needs this exact size" in msg
    # Traced at 1, the 0/1 specialization is the reason and the advice stands.
    joint1 = jl.trace(model, f.train_fn, f.make_inputs(1), dynamic=True)
    with pytest.raises(jl.errors.GuardError, match="specializes sizes 0 and 1.*size >= 2"):
        joint1.run(model, f.make_inputs(3))


# -- memory of a dynamic graph at another size ---------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_dynamic_memory_is_predicted_at_the_given_sizes(mode):
    f = real.get("hf_gpt2")
    model = f.make_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        joint = jl.trace(model, f.train_fn, real.lm_inputs(2, 8), mode=mode, dynamic=True)
    assert joint.memory().input_sizes == {"input_ids": (2, 8), "labels": (2, 8)}
    peaks = set()
    for batch, seq in [(3, 5), (4, 16)]:
        prof = joint.memory(model, real.lm_inputs(batch, seq))
        assert prof.input_sizes == {"input_ids": (batch, seq), "labels": (batch, seq)}
        assert prof.peak_bytes == prof.measured_peak_bytes
        assert (prof.timeline["total"] == prof.timeline["measured"]).all()
        peaks.add(prof.peak_bytes)
    assert len(peaks) == 2


# -- mixture-of-experts refusals -----------------------------------------------------------
_ADVICE = 'experts_implementation="batched_mm"'
_CALL_SITE = "fixtures/real.py"  # moe_train_fn's model(...) call: the user's line


_GROUPED_MM_TRACES = (2, 15, 0)  # torch 2.15's _grouped_mm takes float32 on the CPU


@needs_torch(_GROUPED_MM_TRACES, "tracing HF grouped_mm experts (refused before)")
@pytest.mark.parametrize("mode", MODES)
def test_moe_grouped_mm_traces_and_matches_eager(mode):
    model = real._build("AutoModelForCausalLM", "mixtral")  # default: grouped_mm
    assert _hf_compat.experts_implementation(model) == "grouped_mm"
    joint = jl.trace(model, real.moe_train_fn, real.lm_inputs(), mode=mode)
    assert any(str(n.target) == "aten._grouped_mm.default" for n in joint.graph.nodes)
    c = jl.compare(joint, model, real.lm_inputs())
    assert c.ok and c.first_inexact is None, c


@pytest.mark.skipif(release(torch.__version__) >= _GROUPED_MM_TRACES,
                    reason=f"torch {torch.__version__} traces grouped_mm experts "
                           "(test_moe_grouped_mm_traces_and_matches_eager)")
@pytest.mark.parametrize("mode", MODES)
def test_moe_grouped_mm_refusal_names_the_working_implementation(mode):
    model = real._build("AutoModelForCausalLM", "mixtral")  # default: grouped_mm
    assert _hf_compat.experts_implementation(model) == "grouped_mm"
    before = deep_state(model)
    with pytest.raises(jl.errors.TraceError) as info:
        jl.trace(model, real.moe_train_fn, real.lm_inputs(), mode=mode)
    msg = str(info.value)
    assert 'experts_implementation="grouped_mm"' in msg and _ADVICE in msg
    assert _CALL_SITE in msg and "moe.py:" in msg
    assert isinstance(info.value.__cause__, RuntimeError)
    # torch's own message: "BF16" (2.13), "BFloat16" (2.14)
    assert "BF16" in str(info.value.__cause__) or "BFloat16" in str(info.value.__cause__)
    assert_unchanged(before, model)


@pytest.mark.parametrize("mode", MODES)
def test_moe_eager_loop_refusal_names_the_working_implementation(mode):
    model = real._build("AutoModelForCausalLM", "mixtral", experts_implementation="eager")
    before = deep_state(model)
    with pytest.raises(jl.errors.DataDependentError) as info:
        jl.trace(model, real.moe_train_fn, real.lm_inputs(), mode=mode)
    msg = str(info.value)
    assert ".nonzero()" in msg and 'experts_implementation="eager"' in msg and _ADVICE in msg
    assert _CALL_SITE in msg
    assert info.value.__cause__ is not None
    assert_unchanged(before, model)


def test_non_moe_errors_pass_through_unchanged():
    model, inputs = _tiny_gpt2()

    def train_fn(model, input_ids, labels):
        raise RuntimeError("boom")

    # Not an MoE failure: the MoE advice stays out; the user's own error keeps
    # its type and is chained unchanged.
    with pytest.raises(RuntimeError, match="boom") as info:
        jl.trace(model, train_fn, inputs)
    assert "experts_implementation" not in str(info.value)
    assert type(info.value.__cause__) is RuntimeError and str(info.value.__cause__) == "boom"


# -- baked constants -----------------------------------------------------------------------
def _baked(model, train_fn, inputs, mode):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jl.trace(model, train_fn, inputs, mode=mode)
    return [str(w.message) for w in caught if w.category is jl.errors.BakedConstantWarning]


def _with_cache(model, **kw):
    return model(**kw, use_cache=True).loss


@pytest.mark.parametrize(("name", "mode"), [("hf_gpt2", "make_fx"), ("hf_gpt2", "aot"),
                                            ("hf_llama", "make_fx"), ("hf_t5", "aot")])
def test_kv_cache_constant_warns_with_the_fix(name, mode):
    f = real.get(name)
    msgs = _baked(f.make_model(), _with_cache, f.make_inputs(2), mode)
    assert len(msgs) == 1, msgs
    assert "KV cache" in msgs[0] and "pass use_cache=False" in msgs[0]
    assert "values captured from Python" not in msgs[0]


@pytest.mark.parametrize("mode", MODES)
def test_captured_values_still_warn_next_to_fresh_literals(mode):
    from tests.fixtures import zoo

    f = zoo.get("mlp")
    temperature = 1.7
    # A captured tensor is baked data (AOT mode cannot take one at all, a separate issue).
    gain = torch.tensor(2.0) if mode == "make_fx" else 1.0

    def train_fn(model, x, y):
        x = x.clone()
        x[..., 0] = temperature  # a fresh scalar literal holding a captured number
        x[..., 1] = 3.0  # a literal of the code: not captured state
        return f.train_fn(model, x, y) * gain

    msgs = _baked(f.make_model(), train_fn, f.make_inputs(2), mode)
    assert len(msgs) == 1, msgs
    assert "train_fn: temperature = 1.7" in msgs[0]
    assert ("tensor[] torch.float32" in msgs[0]) == (mode == "make_fx")
    assert "3.0" not in msgs[0]


# -- the graph runs eager's attention kernels, on any CPU ------------------------------
def _attention_calls_of_eager(fixture, model, inputs) -> list[tuple[str, list]]:
    """Every attention kernel eager dispatches for one step, with its tensor shapes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: list[tuple[str, list]] = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "attention" in str(func):
                calls.append((str(func), [tuple(a.shape) for a in args
                                          if isinstance(a, torch.Tensor)]))
            return func(*args, **(kwargs or {}))

    params = [p for p in model.parameters() if p.requires_grad]
    with Log():
        out = fixture.train_fn(model, **inputs)
        loss = out[0] if isinstance(out, tuple) else out
        torch.autograd.grad(loss, params, allow_unused=True)
    return calls


def _attention_calls_of_graph(joint) -> list[tuple[str, list]]:
    out = []
    for n in joint.graph_module.graph.nodes:
        if n.op == "call_function" and "attention" in str(n.target):
            out.append((str(n.target), [tuple(a.meta["val"].shape) for a in n.args
                                        if isinstance(getattr(a, "meta", {}).get("val"),
                                                      torch.Tensor)]))
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["hf_llama", "hf_mistral", "hf_qwen2", "hf_mixtral", "hf_phi3",
                                  "hf_whisper"])
def test_graph_runs_eagers_attention_kernels(name, mode):
    """Grouped-query models keep SDPA's native GQA (K/V with fewer heads, no mask).

    transformers' packed-sequence check reads the position ids; answered "packed" while
    tracing, it materialised a causal mask and repeated K/V to every head, so the graph
    ran other kernels than eager and differed in the last bits on AVX2 CPUs (never on
    AVX-512, where the sums happen to round alike). The op list is the same on any CPU.
    Phi-3 is a held-out grouped-query family (fused qkv); Whisper adds non-causal
    encoder attention and cross-attention, whose query and key lengths differ.
    """
    import copy

    f, model, inputs, joint = traced_real(name, mode)
    want = _attention_calls_of_eager(f, copy.deepcopy(model), inputs)
    assert want, "the fixture runs no attention kernel: the test would check nothing"
    assert _attention_calls_of_graph(joint) == want


def test_position_ids_that_do_not_count_up_keep_the_general_branch():
    """Position ids passed by the caller are data: the shim leaves them to transformers."""
    f = real.get("hf_llama")
    model, inputs = f.make_model(), f.make_inputs(2)
    seq = inputs["input_ids"].shape[1]
    pos = torch.arange(seq).repeat(2, 1)
    pos[1, seq // 2:] = torch.arange(seq - seq // 2)  # row 1 packs two sequences

    def fn(m, input_ids, labels, position_ids):
        return m(input_ids=input_ids, labels=labels, position_ids=position_ids,
                 use_cache=False).loss

    joint = jl.trace(model, fn, {**inputs, "position_ids": pos})
    ops = [str(n.target) for n in joint.graph_module.graph.nodes]
    assert "aten.cumsum.default" in ops  # the packing is computed from the values at run time
    torch.manual_seed(3)
    got = joint.run(model, {**inputs, "position_ids": pos})
    want = eager_step(model, fn, {**inputs, "position_ids": pos}, seed=3)
    assert torch.equal(got[0], want[0])  # both took the packed branch: the same kernels
    for k in want[1]:
        assert torch.equal(got[1][k], want[1][k]), k
