"""Gradient checkpointing: exact against eager in both modes, recompute flags, reentrant refusal."""

from __future__ import annotations

import collections
import copy
import functools
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as torch_checkpoint
from torch.utils._python_dispatch import TorchDispatchMode

import jointlab as jl
from jointlab import errors
from jointlab.meta import KEY
from jointlab.viz import dagview
from tests.fixtures import real
from tests.util import assert_unchanged, deep_state, eager_step

NON_REENTRANT = {"use_reentrant": False}


def _llama_checkpoint():
    model = real._build("AutoModelForCausalLM", "llama", attention_dropout=0.1)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=NON_REENTRANT)
    return model


# name -> (model builder, train_fn, inputs, checkpointed-module prefix)
CASES = {
    "checkpoint_mlp": (real.get("checkpoint_mlp").make_model, real.get("checkpoint_mlp").train_fn,
                       real.get("checkpoint_mlp").make_inputs, "blocks."),
    "hf_gpt2_checkpoint": (real.get("hf_gpt2_checkpoint").make_model, real.lm_train_fn,
                           real.lm_inputs, "transformer.h."),
    "hf_llama_checkpoint": (_llama_checkpoint, real.lm_train_fn, real.lm_inputs,
                            "model.layers."),
}
# AOT mode is exact too, but HF models do not trace in AOT mode here for a reason
# unrelated to checkpointing (transformers' masking_utils reads a mask value).
MODES = [(n, "make_fx") for n in CASES] + [("checkpoint_mlp", "aot")]


@functools.cache
def _traced(name: str, mode: str):
    build, train_fn, make_inputs, _ = CASES[name]
    model, inputs = build(), make_inputs()
    torch.manual_seed(1234)
    before = deep_state(model)
    joint = jl.trace(model, train_fn, inputs, mode=mode)
    assert_unchanged(before, model)  # model *and* the global RNG state
    return model, train_fn, inputs, joint


def _eager_grads(model, train_fn, inputs):
    loss = train_fn(model, **inputs)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
    return loss.detach(), dict(zip(names, grads))


@pytest.mark.parametrize(("name", "mode"), MODES)
def test_two_steps_bit_exact_with_eager_and_rng_advances_alike(name, mode):
    model, train_fn, inputs, joint = _traced(name, mode)
    graph_model, eager_model = copy.deepcopy(model), copy.deepcopy(model)
    torch.manual_seed(7)
    eager_rng = torch.get_rng_state()
    for _ in range(2):  # no reseeding in between: the second step uses the advanced RNG
        loss, grads, _ = joint.run(graph_model, inputs)
        graph_rng = torch.get_rng_state()
        torch.set_rng_state(eager_rng)
        eloss, egrads = _eager_grads(eager_model, train_fn, inputs)
        eager_rng = torch.get_rng_state()
        assert torch.equal(loss, eloss)
        assert list(grads) == list(egrads)
        for k in grads:
            assert torch.equal(grads[k], egrads[k]), k
        for (k, a), (_, b) in zip(graph_model.named_buffers(), eager_model.named_buffers()):
            assert torch.equal(a, b), k
        assert torch.equal(graph_rng, eager_rng), "the graph advanced the RNG differently"
        torch.set_rng_state(graph_rng)


@pytest.mark.parametrize("name", ["checkpoint_mlp", "hf_gpt2_checkpoint"])
@pytest.mark.parametrize("bulk", [False, True])
def test_stepper_exact_and_leaves_user_rng_alone(name, bulk):
    model, train_fn, inputs, joint = _traced(name, "make_fx")
    stepper = jl.Stepper(joint, copy.deepcopy(model), inputs, seed=0)
    user = torch.get_rng_state()
    if bulk:
        out = stepper.run()
    else:
        while not stepper.done:
            stepper.step()
        out = stepper.outputs
    assert torch.equal(user, torch.get_rng_state())
    eloss, egrads, _ = eager_step(copy.deepcopy(model), train_fn, inputs, 0)
    loss, grads, _ = out
    assert torch.equal(loss, eloss)
    for k in egrads:
        assert torch.equal(grads[k], egrads[k]), k


@pytest.mark.parametrize(("name", "mode"), [("checkpoint_mlp", "make_fx"),
                                            ("checkpoint_mlp", "aot"),
                                            ("hf_gpt2_checkpoint", "make_fx")])
def test_memory_and_compare_on_checkpointed_graphs(name, mode):
    model, _, inputs, joint = _traced(name, mode)
    mem = joint.memory()
    assert mem.peak_bytes > 0
    assert jl.compare(joint, model, inputs, seed=3).ok


# -- the recompute flag -------------------------------------------------------------------
class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _eager_backward_ops(model, train_fn, inputs):
    torch.manual_seed(0)
    loss = train_fn(model, **inputs)
    params = [p for p in model.parameters() if p.requires_grad]
    with _OpCounter() as counter:
        torch.autograd.grad(loss, params, allow_unused=True)
    return counter.ops


def _no_checkpoint(fn, *args, use_reentrant=None, **kwargs):
    return fn(*args, **kwargs)


def _eager_recompute_ops(name, monkeypatch):
    """Ops eager autograd runs in backward with checkpointing, minus those without it."""
    build, train_fn, make_inputs, _ = CASES[name]
    inputs = make_inputs()
    with_ckpt = _eager_backward_ops(build(), train_fn, inputs)
    plain = build()
    if name == "checkpoint_mlp":
        monkeypatch.setattr(torch_checkpoint, "checkpoint", _no_checkpoint)
    else:
        plain.gradient_checkpointing_disable()
    without = _eager_backward_ops(plain, train_fn, inputs)
    monkeypatch.undo()
    assert not without - with_ckpt, "checkpointing removed backward ops"
    return with_ckpt - without


_SAVED_DETACH = (torch.ops.aten.detach.default, torch.ops.aten.alias.default)


def _aten_ops(nodes) -> collections.Counter:
    # The generator-state nodes are jointlab's replay of checkpoint's Python calls;
    # saved-tensor detaches are make_fx artefacts with no eager dispatch (torch 2.14
    # records them as aten.alias).
    return collections.Counter(str(n.target) for n in nodes
                               if str(n.target).startswith("aten.")
                               and n.target not in _SAVED_DETACH)


@pytest.mark.parametrize("name", ["checkpoint_mlp", "hf_gpt2_checkpoint"])
def test_recompute_flag_matches_what_eager_recomputes(name, monkeypatch):
    _, _, _, joint = _traced(name, "make_fx")
    prefix = CASES[name][3]
    flagged = [n for n in joint.graph.nodes if n.meta[KEY]["recompute"]]
    assert flagged and all(n.meta[KEY]["phase"] == "backward" for n in flagged)
    assert all(n.meta[KEY]["module"].startswith(prefix) for n in flagged
               if str(n.target).startswith("aten.")), "recompute outside the checkpointed region"
    eager = _eager_recompute_ops(name, monkeypatch)
    eager.pop("aten.detach.default", None)
    assert _aten_ops(flagged) == eager
    table = joint.nodes
    assert table["recompute"].dtype == bool
    assert set(table.index[table["recompute"]]) == {n.name for n in flagged}


def test_no_recompute_flags_without_checkpointing(monkeypatch):
    f = real.get("checkpoint_mlp")
    monkeypatch.setattr(torch_checkpoint, "checkpoint", _no_checkpoint)
    joint = jl.trace(f.make_model(), f.train_fn, f.make_inputs())
    assert all(n.meta[KEY]["recompute"] is False for n in joint.graph.nodes)
    assert not joint.nodes["recompute"].any()


def test_aot_mode_has_no_recompute_to_flag():
    # AOT export differentiates the traced forward and saves the activations of
    # checkpointed regions: eager's recompute does not happen there, and no node
    # may claim it does.
    _, _, _, joint = _traced("checkpoint_mlp", "aot")
    assert all(n.meta[KEY]["recompute"] is False for n in joint.graph.nodes)


def test_aot_mode_says_its_memory_is_without_checkpointing():
    # Reference: the saved activations a make_fx trace of the same model shows
    # (with recompute) against AOT's, which keeps the checkpointed activations.
    f = real.get("checkpoint_mlp")
    model, inputs = f.make_model(), f.make_inputs(4)
    with pytest.warns(jl.errors.CheckpointWarning, match="2 region"):
        jl.trace(model, f.train_fn, inputs, mode="aot")
    plain = real.get("resnet")
    with warnings.catch_warnings():
        warnings.simplefilter("error", jl.errors.CheckpointWarning)
        jl.trace(plain.make_model(), plain.train_fn, plain.make_inputs(2), mode="aot")


def test_dag_marks_recomputed_nodes():
    """dag_view flags (and rings) exactly the nodes checkpointing recomputes."""
    _, _, _, joint = _traced("checkpoint_mlp", "make_fx")
    marked = dagview.dag_view(joint).payload["nodes"]["recompute"]  # node indices
    flagged = joint.nodes["recompute"].to_numpy()
    assert flagged.sum() > 0
    assert sorted(marked) == np.flatnonzero(flagged).tolist()
    plain = real.get("resnet")
    plain_joint = jl.trace(plain.make_model(), plain.train_fn, plain.make_inputs(2))
    assert dagview.dag_view(plain_joint).payload["nodes"]["recompute"] == []


# -- reentrant checkpointing ------------------------------------------------------------------
class _ReentrantMLP(real.CheckpointedMLP):
    def forward(self, x):
        h = self.inp(x)
        for blk in self.blocks:
            h = h + torch_checkpoint.checkpoint(blk, h, use_reentrant=True)  # REENTRANT LINE
        return self.head(h)


def _reentrant_mlp():
    torch.manual_seed(0)
    return _ReentrantMLP().train()


def _reentrant_gpt2():
    model = real._build("AutoModelForCausalLM", "gpt2")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    return model


_MLP_CASE = (_reentrant_mlp, lambda m, x, y: F.mse_loss(m(x), y),
             real.get("checkpoint_mlp").make_inputs, "test_checkpoint.py")
_GPT2_CASE = (_reentrant_gpt2, real.lm_train_fn, real.lm_inputs, "transformers")


# HF models fail in AOT mode before any checkpoint runs (see MODES), so GPT-2 is make_fx only.
@pytest.mark.parametrize(("case", "mode"), [(_MLP_CASE, "make_fx"), (_MLP_CASE, "aot"),
                                            (_GPT2_CASE, "make_fx")],
                         ids=["mlp-make_fx", "mlp-aot", "hf_gpt2-make_fx"])
def test_reentrant_checkpointing_is_refused_in_both_modes(case, mode):
    build, train_fn, make_inputs, where = case
    model, inputs = build(), make_inputs()
    before = deep_state(model)
    with pytest.raises(errors.UnsupportedCheckpointError) as info:
        jl.trace(model, train_fn, inputs, mode=mode)
    msg = str(info.value)
    assert "use_reentrant=False" in msg and '{"use_reentrant": False}' in msg
    assert where in msg
    if where == "test_checkpoint.py":
        assert "REENTRANT LINE" in msg
    assert_unchanged(before, model)


def test_hf_default_gradient_checkpointing_is_non_reentrant_and_exact():
    # transformers 5.24 defaults to use_reentrant=False when no kwargs are given.
    model = real._build("AutoModelForCausalLM", "gpt2")
    model.gradient_checkpointing_enable()
    inputs = real.lm_inputs()
    joint = jl.trace(model, real.lm_train_fn, inputs)
    assert joint.nodes["recompute"].any()
    torch.manual_seed(0)
    loss, grads, _ = joint.run(copy.deepcopy(model), inputs)
    eloss, egrads, _ = eager_step(copy.deepcopy(model), real.lm_train_fn, inputs, 0)
    assert torch.equal(loss, eloss)
    assert all(torch.equal(grads[k], egrads[k]) for k in egrads)


def test_saved_and_loaded_checkpointed_graph_stays_exact(tmp_path):
    model, train_fn, inputs, joint = _traced("checkpoint_mlp", "make_fx")
    joint.save(str(tmp_path / "g.jlg"))
    loaded = jl.load(str(tmp_path / "g.jlg"))
    assert loaded.nodes["recompute"].sum() == joint.nodes["recompute"].sum() > 0
    torch.manual_seed(0)
    loss, grads, _ = loaded.run(copy.deepcopy(model), inputs)
    eloss, egrads, _ = eager_step(copy.deepcopy(model), train_fn, inputs, 0)
    assert torch.equal(loss, eloss)
    assert all(torch.equal(grads[k], egrads[k]) for k in egrads)
