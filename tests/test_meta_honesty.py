"""Honest answers on the meta device: lost backwards refused, math attention flagged."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

import jointlab as jl
from jointlab.analysis.memory.whatif import functional_joint, what_if
from jointlab.errors import GradientLostError, MetaAttentionWarning
from jointlab.passes.meta_attention import meta_attention_notes
from jointlab.torch_compat import TorchDispatchMode
from tests.fixtures import zoo
from tests.fixtures.real import hf_config
from tests.util import assert_unchanged, deep_state, eager_step

VOCAB = 96


def meta_llama() -> nn.Module:
    """The tiny two-layer HF Llama of the real-model fixtures, on the meta device."""
    import transformers as tr

    with torch.device("meta"):
        model = tr.AutoModelForCausalLM.from_config(hf_config("llama"))
    return model.train()


def cpu_llama() -> nn.Module:
    """The same Llama with real CPU weights (a reference for graph structure)."""
    import transformers as tr

    torch.manual_seed(0)
    return tr.AutoModelForCausalLM.from_config(hf_config("llama")).train()


def llama_inputs() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 8), generator=gen)
    return {"input_ids": ids, "labels": ids.clone()}  # separate storages, as on meta


def ce_step(model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=input_ids, use_cache=False).logits
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def mse_step(model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=input_ids, use_cache=False).logits
    return F.mse_loss(logits, torch.zeros_like(logits))


def meta_state(model: nn.Module) -> dict[str, tuple]:
    """What tracing must not change on a meta model (values do not exist there)."""
    return {n: (id(t), type(t), t.shape, t.dtype, t.device, t.requires_grad)
            for n, t in [*model.named_parameters(), *model.named_buffers()]}


def backward_count(joint: jl.JointGraph) -> int:
    return sum(1 for n in joint.graph.nodes if n.meta["jointlab"]["phase"] == "backward")


class _OpOutputs(TorchDispatchMode):
    """Every ATen op eager dispatches, with its outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[object, object]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls.append((func, out))
        return out


def loss_op_of(step) -> str:
    """The ATen op that allocates ``step``'s loss in eager on CPU (an independent reference)."""
    with _OpOutputs() as rec:
        loss = step(cpu_llama(), **llama_inputs())
    for func, out in rec.calls:
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if any(isinstance(o, torch.Tensor) and o.data_ptr() == loss.data_ptr() for o in outs):
            return func.__name__.split(".")[0]
    raise AssertionError("no op produced the loss")


def test_aot_meta_cross_entropy_is_refused_and_model_unchanged():
    model = meta_llama()
    before = meta_state(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own "no autograd kernel" warning
        with pytest.raises(GradientLostError) as info:
            jl.trace(model, ce_step, llama_inputs(), mode="aot")
    msg = str(info.value)
    assert "mse_loss" in msg and "logsumexp" in msg
    # the loss op named is the one eager computes the loss with, at the user's loss line
    # (torch's warning clause names aten::nll_loss too, so a bare "nll_loss" proves nothing)
    lines, first = inspect.getsourcelines(ce_step)
    line = first + next(i for i, s in enumerate(lines) if "F.cross_entropy" in s)
    assert f"computed by aten::{loss_op_of(ce_step)} at test_meta_honesty.py:{line})" in msg
    assert "model.embed_tokens.weight" in msg and "of 21 parameters" in msg
    assert "test_meta_honesty.py" in msg  # the user's loss line
    assert meta_state(model) == before


def test_aot_meta_mse_keeps_the_whole_backward():
    # Reference: the same model with real CPU weights, where every kernel exists.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meta = jl.trace(meta_llama(), mse_step, llama_inputs(), mode="aot")
    cpu_model = cpu_llama()
    cpu = jl.trace(cpu_model, mse_step, llama_inputs(), mode="aot")
    # Meta's attention takes the math path, so the graphs differ; the gradients must not.
    with_grad = {n for n, (_, g) in meta.param_grads.items() if g is not None}
    assert with_grad == {n for n, (_, g) in cpu.param_grads.items() if g is not None}
    assert len(with_grad) == 21 and backward_count(meta) >= backward_count(cpu) > 250
    assert all(g.meta["val"].shape == p.meta["val"].shape for p, g in meta.param_grads.values())
    loss, grads, _ = cpu.run(cpu_model, llama_inputs())
    ref_loss, ref_grads, _ = eager_step(cpu_model, mse_step, llama_inputs(), seed=0)
    assert torch.equal(loss, ref_loss)
    assert all(torch.allclose(grads[n], ref_grads[n], atol=1e-6) for n in ref_grads)


def test_make_fx_meta_cross_entropy_is_not_refused():
    joint = jl.trace(meta_llama(), ce_step, llama_inputs())
    assert all(g is not None for _, g in joint.param_grads.values())


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_unused_parameter_keeps_its_zero_gradient(mode):
    fx_ = zoo.get("unused_param")
    model, inputs = fx_.make_model(), fx_.make_inputs(4)
    joint = jl.trace(model, fx_.train_fn, inputs, mode=mode)
    assert joint.param_grads["unused.weight"][1] is None
    _, grads, _ = joint.run(model, inputs)
    _, ref, _ = eager_step(model, fx_.train_fn, inputs, seed=0)
    assert torch.count_nonzero(grads["unused.weight"]) == 0
    assert all(torch.equal(grads[n], ref[n]) for n in ref)


# A custom op with no autograd kernel: torch only warns and the gradient is None,
# in eager and in both tracing modes.
_LIB = torch.library.Library("jltest_honesty", "DEF")
_LIB.define("double(Tensor x) -> Tensor")
_LIB.impl("double", lambda x: x * 2, "CompositeExplicitAutograd")


class TwoStage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = nn.Linear(4, 4)
        self.spare = nn.Linear(4, 4)  # never used: its zero gradient is not "lost"

    def forward(self, x: torch.Tensor, through_op: bool) -> torch.Tensor:
        h = self.first(x)
        if through_op:
            h = torch.ops.jltest_honesty.double(h)
        return self.second(h)


def _all_through_op(model, x):
    return torch.ops.jltest_honesty.double(model(x, False)).sum()


def _half_through_op(model, x):
    return model(x, True).sum()


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
@pytest.mark.parametrize("step,lost", [(_all_through_op, "4 of 4"), (_half_through_op, "2 of 4")])
def test_op_without_autograd_kernel_is_refused(mode, step, lost):
    torch.manual_seed(0)
    model, x = TwoStage(), torch.randn(2, 4)
    before = deep_state(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(GradientLostError, match="jltest_honesty::double") as info:
            jl.trace(model, step, {"x": x}, mode=mode)
    msg = str(info.value)
    assert "first.weight" in msg and f"gradients of {lost} " in msg and "spare" not in msg
    assert_unchanged(before, model)


# -- attention on meta: math path flagged, CPU fakes pick the fused kernel ------------
def _ops(joint: jl.JointGraph) -> list[str]:
    return [str(n.target) for n in joint.graph.nodes if n.op == "call_function"]


def test_meta_attention_takes_math_path_and_says_so():
    with pytest.warns(MetaAttentionWarning, match="math path only because"):
        joint = jl.trace(meta_llama(), mse_step, llama_inputs())
    notes = meta_attention_notes(joint)
    assert len(notes) == 2 and notes[0]["q_shape"] == (2, 4, 8, 8)  # two layers, 4 heads
    assert not any("flash" in op for op in _ops(joint))


def test_fake_cpu_trace_matches_a_real_cpu_trace_and_is_not_flagged():
    model = meta_llama()
    before = meta_state(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MetaAttentionWarning)
        with jl.fake_cpu():
            fake = jl.trace(model, mse_step, llama_inputs())
        real = jl.trace(cpu_llama(), mse_step, llama_inputs())  # the reference
    assert meta_state(model) == before
    assert meta_attention_notes(fake) == []
    assert _ops(fake) == _ops(real) and any("flash_attention" in op for op in _ops(real))
    assert fake.memory().peak_bytes == real.memory().peak_bytes
    with pytest.warns(MetaAttentionWarning):
        meta = jl.trace(model, mse_step, llama_inputs())
    assert meta.memory().peak_bytes > fake.memory().peak_bytes


# -- what_if on meta and CPU-fake traces ------------------------------------------------
def _scores(table):
    cols = ["saved_bytes", "forward_peak_bytes", "backward_peak_bytes", "peak_bytes"]
    assert "error" not in table or table["error"].isna().all(), table.get("error")
    return table[cols].iloc[1:].to_dict("records")  # the partitioner options


def test_what_if_works_on_meta_in_both_modes_and_allocates_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        joints = [jl.trace(meta_llama(), mse_step, llama_inputs(), mode=m)
                  for m in ("make_fx", "aot")]
    make_fx_rows, aot_rows = (_scores(what_if(j)) for j in joints)
    assert make_fx_rows == aot_rows  # two independent traces of one step split alike
    for joint in joints:
        _, _, args = functional_joint(joint)
        assert all(isinstance(a, FakeTensor) and a.device.type == "meta"
                   for a in args if isinstance(a, torch.Tensor))


def test_what_if_on_cpu_fakes_equals_what_if_on_real_weights():
    with jl.fake_cpu():
        fake = jl.trace(meta_llama(), mse_step, llama_inputs())
    real = jl.trace(cpu_llama(), mse_step, llama_inputs())
    assert _scores(what_if(fake)) == _scores(what_if(real))
