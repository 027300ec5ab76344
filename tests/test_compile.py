"""joint.compile(): a CompiledJoint runs compiled code and refuses to pass for the traced graph."""

from __future__ import annotations

import pytest
import torch

import jointlab as jl
from jointlab.errors import CompiledGraphError
from tests.fixtures import real, zoo
from tests.util import assert_unchanged, deep_state, eager_step, one_thread


@pytest.fixture(scope="module")
def compiled_mlp():
    f = zoo.FIXTURES["mlp"]
    model, inputs = f.make_model(), f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs)
    return f, model, inputs, joint, joint.compile("aot_eager")


def test_run_goes_through_the_compiled_code_and_matches_eager(compiled_mlp):
    f, model, inputs, joint, compiled = compiled_mlp
    calls = []
    compiled.compiled = _counting(compiled.compiled, calls)
    loss, grads, _ = compiled.run(model, inputs)
    assert calls == [1]  # the compiled callable ran, not the GraphModule
    want_loss, want_grads, _ = eager_step(f.make_model(), f.train_fn, inputs, seed=0)
    torch.testing.assert_close(loss, want_loss)
    assert grads.keys() == want_grads.keys()
    for k, g in want_grads.items():
        torch.testing.assert_close(grads[k], g)


def _counting(fn, calls):
    def wrapped(*args):
        calls.append(1)
        return fn(*args)
    return wrapped


def test_stepper_memory_and_nodes_refuse_a_compiled_graph(compiled_mlp):
    _, model, inputs, joint, compiled = compiled_mlp
    before = deep_state(model)
    for attempt in (lambda: compiled.memory(), lambda: compiled.nodes):
        with pytest.raises(CompiledGraphError, match=r"compiled\.source") as err:
            attempt()
        assert "jl.Stepper(compiled, model, inputs) steps it kernel by kernel" in str(err.value)
    # stepping compiled code needs jointlab's own Inductor compile (tests/test_compiled_step.py)
    with pytest.raises(CompiledGraphError, match=r"backend='aot_eager'.*compiled\.source"):
        jl.Stepper(compiled, model, inputs, device="cpu")
    assert_unchanged(before, model)
    s = jl.Stepper(compiled.source, model, inputs, device="cpu", seed=0)  # the way out
    assert s.run() is not None and compiled.source is joint


def test_no_silent_delegation_to_the_traced_graph(compiled_mlp):
    *_, joint, compiled = compiled_mlp
    for name in ("graph_module", "graph", "summary", "select", "save", "param_grads"):
        assert hasattr(joint, name) and not hasattr(compiled, name), name


def test_compare_method_repr_and_export(compiled_mlp):
    f, model, inputs, joint, compiled = compiled_mlp
    c = compiled.compare(model, inputs, train_fn=f.train_fn)
    assert c.ok and set(c.grads["candidate"]) == {"aot_eager", "graph"}
    text = repr(compiled)
    assert text.startswith("CompiledJoint(backend='aot_eager'") and len(text) < 100
    assert f"{len(joint.graph.nodes)} nodes" in text
    assert isinstance(compiled, jl.CompiledJoint)


def _one_layer(name):
    """The tiny HF fixture ``name`` with one layer (a short CPU compile)."""
    import transformers as tr

    f = real.get(name)
    family, auto = {"hf_gpt2": ("gpt2", "AutoModelForCausalLM"),
                    "hf_bert": ("bert", "AutoModelForMaskedLM")}[name]
    cfg = real.hf_config(family)
    cfg.num_hidden_layers = 1  # n_layer for GPT-2 (an attribute map)
    torch.manual_seed(0)
    model = getattr(tr, auto).from_config(cfg).train()
    assert len(model.base_model.encoder.layer if family == "bert" else model.transformer.h) == 1
    return f, model, f.make_inputs()


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
@pytest.mark.parametrize("name", ["hf_gpt2", "hf_bert"])
def test_hf_model_compiles_with_inductor_and_compares_clean(name, mode):
    with one_thread():
        f, model, inputs = _one_layer(name)
        joint = jl.trace(model, f.train_fn, inputs, mode=mode)
        compiled = joint.compile("inductor")
        before = deep_state(model)
        c = compiled.compare(model, inputs, train_fn=f.train_fn)
    assert_unchanged(before, model)
    print(c, compiled, sep="\n")
    assert c.ok, c
    # the compiled side itself, against eager autograd under the same seed (dropout on)
    mine = c.grads[c.grads["candidate"] == "inductor"]
    assert len(mine) == len(joint.param_names) and bool(mine["ok"].all())
    assert bool(c.loss[c.loss["candidate"] == "inductor"]["ok"].all())
    assert c.kernels is None  # nothing to bisect
    assert compiled.coverage().compute > 50
