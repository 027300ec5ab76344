"""jointlab.torch_compat.backport: torch 2.13's make_fx hooks rebuilt for torch 2.11 and 2.12.

Colab ships torch 2.11, which lacks ``torch.compiler._patch_engine_backward``,
``_non_strict_tracing_context`` and ``torch.fx.proxy._register_stack_trace_anchor``.
On a torch that has them, these tests take them away and make jointlab use its
rebuild: every node's annotations (phase, module, source, twin, gradient-of,
category) must equal those of torch's own hooks, and the graph must still match
eager exactly. On torch 2.11/2.12 the rebuild is what every trace uses.

mode="aot" uses the same hooks in place of the AOT export's own on 2.11/2.12
(whose hooks set no ``autograd_backward`` mark, so no backward node would find
its forward twin): on 2.13+ the tests swap them in and compare the same way,
plus the raw marks (``autograd_backward``, ``is_gradient_acc``, ``seq_nr``) and
the accumulations' ``grad_acc_of``.
"""

from __future__ import annotations

import pytest
import torch

import jointlab as jl
from jointlab.torch_compat import aot as compat_aot
from jointlab.torch_compat import graphs as compat_graphs
from jointlab.torch_compat import release
from tests.fixtures import zoo

KEYS = ("phase", "module", "source", "grad_of", "fwd_twin", "category")
HAS_OWN = release(torch.__version__) >= (2, 13, 0)


def _annotations(name: str) -> dict[str, tuple]:
    f = zoo.FIXTURES[name]
    torch.manual_seed(0)
    joint = jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))
    return {n.name: tuple(str(n.meta["jointlab"].get(k)) for k in KEYS)
            for n in joint.graph.nodes}


def _use_the_backport(monkeypatch) -> None:
    monkeypatch.setattr(compat_graphs, "_before_2_13", lambda: True)
    for obj, name in ((torch.compiler, "_patch_engine_backward"),
                      (torch.compiler, "_non_strict_tracing_context"),
                      (torch.fx.proxy, "_register_stack_trace_anchor")):
        monkeypatch.delattr(obj, name, raising=False)


@pytest.mark.skipif(not HAS_OWN, reason="needs torch's own hooks (2.13+) to compare with")
@pytest.mark.parametrize("name", ["tiny_lm", "cnn_bn", "nested_inputs", "unused_param",
                                  "shared_submodule"])
def test_backport_annotates_like_torchs_own_hooks(monkeypatch, name):
    own = _annotations(name)
    _use_the_backport(monkeypatch)
    rebuilt = _annotations(name)
    diff = {n: (rebuilt.get(n), a) for n, a in own.items() if rebuilt.get(n) != a}
    assert not diff, f"{len(diff)} nodes differ (backport, torch's own): {list(diff.items())[:5]}"
    assert rebuilt.keys() == own.keys()


def test_backport_restores_torch_after_tracing(monkeypatch):
    if HAS_OWN:
        _use_the_backport(monkeypatch)
    engine = torch.autograd.graph._engine_run_backward
    fields = list(torch.fx.proxy._COPY_META_FIELDS)
    filt = torch.fx.proxy.TracerBase._filter_traceback_frames
    f = zoo.FIXTURES["mlp"]
    model, inputs = f.make_model(), f.make_inputs(2)
    joint = jl.trace(model, f.train_fn, inputs)
    assert jl.compare(joint, model, inputs).ok
    assert torch.autograd.graph._engine_run_backward is engine
    assert torch.fx.proxy._COPY_META_FIELDS == fields
    assert torch.fx.proxy.TracerBase._filter_traceback_frames is filt
    # and eager backward outside a trace is untouched
    x = torch.randn(3, requires_grad=True)
    (x * 2).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))


AOT_KEYS = (*KEYS, "grad_acc_of")
RAW = ("autograd_backward", "is_gradient_acc", "seq_nr")


def _aot_marks(name: str) -> dict[str, tuple]:
    f = zoo.FIXTURES[name]
    torch.manual_seed(0)
    model, inputs = f.make_model(), f.make_inputs(2)
    joint = jl.trace(model, f.train_fn, inputs, mode="aot")
    assert jl.compare(joint, model, inputs).ok
    # seq_nr counts on from earlier traces: compare it relative to the graph's first
    first = min(n.meta["seq_nr"] for n in joint.graph.nodes if "seq_nr" in n.meta)
    return {n.name: (*(str(n.meta["jointlab"].get(k)) for k in AOT_KEYS),
                     *(bool(n.meta.get(k)) for k in RAW[:2]),
                     n.meta["seq_nr"] - first if "seq_nr" in n.meta else None)
            for n in joint.graph.nodes}


@pytest.mark.skipif(not HAS_OWN, reason="needs the AOT export's own marks (2.13+) to compare with")
@pytest.mark.parametrize("name", ["tiny_lm", "shared_submodule"])
def test_aot_backport_marks_like_torchs_own_export(monkeypatch, name):
    own = _aot_marks(name)
    assert any(a[-2] for a in own.values()), "the fixture has no gradient accumulation"
    monkeypatch.setattr(compat_aot, "MARKS_ENGINE_BACKWARD_IN_AOT", False)
    rebuilt = _aot_marks(name)
    diff = {n: (rebuilt.get(n), a) for n, a in own.items() if rebuilt.get(n) != a}
    assert not diff, f"{len(diff)} nodes differ (backport, torch's own): {list(diff.items())[:5]}"
    assert rebuilt.keys() == own.keys()


def test_aot_backport_restores_torch_after_tracing(monkeypatch):
    monkeypatch.setattr(compat_aot, "MARKS_ENGINE_BACKWARD_IN_AOT", False)
    capture = compat_aot.torch_module("torch._functorch._aot_autograd.graph_capture_wrappers",
                                      "test")
    hooks = capture.setup_stacktrace_preservation_hooks
    fields = list(torch.fx.proxy._COPY_META_FIELDS)
    marks = _aot_marks("mlp")
    assert any(m[-3] for m in marks.values())  # the backward nodes were tagged
    assert capture.setup_stacktrace_preservation_hooks is hooks
    assert torch.fx.proxy._COPY_META_FIELDS == fields
    assert "autograd_backward" not in torch.fx.traceback.get_current_meta()
