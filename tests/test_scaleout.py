"""Scale-out honesty: memory against Inductor's estimator, AOT with DTensor parameters."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._inductor.fx_passes.memory_estimator import build_memory_profile
from torch.fx.experimental.proxy_tensor import make_fx

import jointlab as jl
from jointlab.analysis.memory.crosscheck import inductor_memory_profile, inductor_peak_bytes
from jointlab.analysis.memory.measure import measure_graph
from jointlab.analysis.memory.predict import predict
from jointlab.errors import MemoryQueryError
from jointlab.passes.analyze import ensure_analyzed
from tests.fixtures.real import hf_config
from tests.util import NEEDS_DISTRIBUTED_TORCH, assert_unchanged, deep_state

VOCAB = 96


def meta_llama(layers: int) -> nn.Module:
    """The tiny HF Llama of the real-model fixtures with ``layers`` layers, on meta."""
    import transformers as tr

    cfg = hf_config("llama")
    cfg.num_hidden_layers = layers
    with torch.device("meta"):
        model = tr.AutoModelForCausalLM.from_config(cfg)
    assert len(model.model.layers) == layers
    return model.train()


def llama_inputs() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 16), generator=gen)
    return {"input_ids": ids, "labels": ids.clone()}


def ce_step(model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=input_ids, use_cache=False).logits
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def lse_step(model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy written out (AOT on meta loses F.cross_entropy's backward)."""
    logits = model(input_ids=input_ids, use_cache=False).logits
    picked = logits.gather(-1, labels[..., None]).squeeze(-1)
    return (logits.logsumexp(-1) - picked).mean()


def after_allocation(graph: torch.fx.Graph, profile: list[int]) -> dict[str, int]:
    """Inductor's live bytes right after each op's allocations, by node name."""
    out, k = {}, 1
    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        out[node.name] = profile[k]
        k += 2
    return out


# -- item 1: the predicted peak is Inductor's, to the byte ---------------------------
@pytest.mark.parametrize(("mode", "step", "layers"), [
    ("make_fx", ce_step, 2), ("make_fx", lse_step, 3), ("aot", lse_step, 2)])
def test_meta_llama_memory_equals_inductor_estimator_to_the_byte(mode, step, layers):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jl.errors.MetaAttentionWarning)
        model = meta_llama(layers)
        joint = jl.trace(model, step, llama_inputs(), mode=mode)
    prof = joint.memory()
    graph = joint.graph_module.graph
    # torch's own estimator, called directly; graph inputs are held for the whole run
    theirs = build_memory_profile(graph, lambda n: n.op not in ("placeholder", "get_attr"))
    assert prof.peak_bytes == max(theirs) == inductor_peak_bytes(joint)
    assert inductor_memory_profile(joint) == theirs
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert prof.peak_bytes > params  # activations and gradients on top of the weights
    # not only the peak: every op's live bytes after its allocations agree
    ours = dict(zip(prof.timeline["node"], prof.timeline["total"].tolist()))
    assert after_allocation(graph, theirs) == {k: ours[k] for k in after_allocation(graph, theirs)}



def test_bf16_gap_is_exactly_the_unused_values_inductor_never_frees():
    """In bf16 the math attention path casts the softmax into a copy nobody reads.

    The generated code drops such a value right after its node (measured in
    tests/test_memory.py::test_unused_values_are_dropped_at_once); Inductor's
    estimator frees only at a last use, so it keeps it to the end. At every op
    the two differ by exactly the unused values allocated so far.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jl.errors.MetaAttentionWarning)
        joint = jl.trace(meta_llama(2).to(torch.bfloat16), ce_step, llama_inputs())
    prof = joint.memory()
    graph = joint.graph_module.graph
    theirs = after_allocation(graph, inductor_memory_profile(joint))
    ours = dict(zip(prof.timeline["node"], prof.timeline["total"].tolist()))
    unused = 0
    for node in graph.nodes:
        if node.name not in theirs:
            continue
        assert theirs[node.name] - ours[node.name] == unused, node.name
        if not node.users:
            unused += int(node.meta["jointlab"]["bytes"])
    assert unused > 0  # the bf16 graph has such copies (the fp32 one above has none)
    assert inductor_peak_bytes(joint) > prof.peak_bytes

def test_mse_loss_gap_is_the_full_buffer_the_cpu_kernel_keeps():
    """Where the two differ, the CPU profiler sides with jointlab."""
    def step(x, w):
        y = x @ w
        return F.mse_loss(y, torch.zeros_like(y))

    shapes = ((64, 128), (128, 32))
    real = [torch.randn(s) for s in shapes]
    cpu_gm = make_fx(step, tracing_mode="fake")(*real)
    meta_gm = make_fx(step, tracing_mode="fake")(*[t.to("meta") for t in real])
    for gm in (cpu_gm, meta_gm):
        ensure_analyzed(gm)
    measured = int(measure_graph(cpu_gm, real)["measured"].max())
    ours_cpu, ours_meta = predict(cpu_gm).peak_bytes, predict(meta_gm).peak_bytes
    assert ours_cpu == ours_meta == measured
    full_buffer = 64 * 32 * 4  # the unreduced loss the 0-d result's storage keeps on CPU
    assert ours_meta - inductor_peak_bytes(meta_gm) == full_buffer - 4


def test_cpu_graph_is_refused_not_estimated_as_zero():
    def step(x):
        return x.sin().sum()

    gm = make_fx(step, tracing_mode="fake")(torch.randn(32, 32))
    with pytest.raises(MemoryQueryError, match=r"CPU tensors .*meta device"):
        inductor_peak_bytes(gm)


# -- item 3: AOT mode and DTensor (tensor-subclass) descriptors ------------------------
class TinyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class LocalInputMLP(TinyMLP):
    """Plain parameters; its input is a DTensor whose local shard it computes on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.to_local())


def mse(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(model(x), y)


def tensor_parallel(model: nn.Module, mesh) -> nn.Module:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    return parallelize_module(model, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})


def _aot_refusal(model, x, y) -> str:
    """The message of the refusal of an AOT trace; the model must stay unchanged."""
    before = deep_state(model)
    with pytest.raises(jl.errors.UnsupportedWrapperError) as info:
        jl.trace(model, mse, {"x": x, "y": y}, mode="aot")
    assert_unchanged(before, model)
    return str(info.value)


@NEEDS_DISTRIBUTED_TORCH
def test_aot_with_dtensor_parameters_traces_local_shards_named_by_their_fqn():
    from torch.distributed.tensor import DTensor

    with jl.fake_world(2) as world:
        torch.manual_seed(0)
        model = tensor_parallel(TinyMLP(), world.mesh)
        inputs = {"x": torch.randn(8, 16), "y": torch.randn(8, 16)}
        before = deep_state(model)
        joint = jl.trace(model, mse, inputs, mode="aot")
        assert_unchanged(before, model)
        state = dict(model.named_parameters())
    # Reference: each DTensor's own local shard. One placeholder per DTensor (its mesh is
    # not a graph input), described by torch as the '_local_tensor' part of that parameter.
    assert list(joint.params()) == list(state)
    for fqn, node in joint.params().items():
        assert isinstance(state[fqn], DTensor)
        assert tuple(node.meta["val"].shape) == tuple(state[fqn].to_local().shape)
        assert node.meta["desc"].attr == "_local_tensor"
        assert node.meta["desc"].base.target == f"model.{fqn}"
    assert not [n for n in joint.placeholders if not isinstance(n.meta["val"], torch.Tensor)]


def test_aot_with_other_subclass_parameters_is_refused_naming_dtensor():
    from torch.testing._internal.two_tensor import TwoTensor

    torch.manual_seed(0)
    model = TinyMLP()
    w = model.fc1.weight.detach()
    model.fc1.weight = nn.Parameter(TwoTensor(w.clone(), w.clone()))
    msg = _aot_refusal(model, torch.randn(8, 16), torch.randn(8, 16))
    assert "'fc1.weight' is a TwoTensor (flattened into a, b)" in msg
    assert "maps back only for DTensor parameters and buffers" in msg and "alias" not in msg


@NEEDS_DISTRIBUTED_TORCH
def test_aot_subclass_input_descriptor_is_named_not_blamed_on_aliasing():
    from torch.distributed.tensor import DTensor, Replicate

    with jl.fake_world(2) as world:
        torch.manual_seed(0)
        x = DTensor.from_local(torch.randn(8, 16), world.mesh, [Replicate()])
        msg = _aot_refusal(LocalInputMLP(), x, torch.randn(8, 16))
    assert "input that is one part ('_local_tensor') of tensor input 0" in msg
    assert "alias" not in msg
    # Both modes trace DTensor state, not DTensor inputs: the message must say so.
    assert "trace in both modes (mode='make_fx', the default, or mode='aot')" in msg
    assert "Pass inputs as plain (local) tensors" in msg


class _Float8Matmul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        one = torch.ones(())
        h = self.fc(x).to(torch.float8_e4m3fn)
        w = self.fc.weight.to(torch.float8_e4m3fn).t()
        return torch._scaled_mm(h, w, scale_a=one, scale_b=one, out_dtype=torch.float32)


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_a_backward_without_a_derivative_is_named_by_its_op(mode):
    model, x = _Float8Matmul(), torch.randn(16, 16)
    try:  # the reference: eager's own backward, and the op its error names
        model(x).sum().backward()
    except RuntimeError as exc:
        eager = str(exc)
    else:
        pytest.skip("this torch has a derivative for _scaled_mm")
    assert "aten::_scaled_mm" in eager
    with pytest.raises(jl.errors.TraceError, match=r"failed in the backward .*no derivative "
                       r"for aten::_scaled_mm.*autograd.Function") as info:
        jl.trace(model, lambda m, x: m(x).sum(), {"x": x}, mode=mode)
    assert "no specific check" not in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    if mode == "make_fx":  # the forward's call, from make_fx's own stack trace of that node
        import inspect

        lines, first = inspect.getsourcelines(_Float8Matmul.forward)
        call = first + next(i for i, t in enumerate(lines) if "torch._scaled_mm(" in t)
        assert f"which the forward calls at test_scaleout.py:{call}," in str(info.value)
