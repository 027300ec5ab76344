"""What-if partitions: the functional copy is right, and saved bytes match eager autograd.

Both tracing modes: make_fx graphs get a functional copy with a tangent; aot
graphs are split as exported, at the tangent their descriptors name.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch._functorch.partitioners import default_partition

import jointlab as jl
from jointlab.analysis.memory.measure import measure
from jointlab.analysis.memory.predict import predict
from jointlab.analysis.memory.whatif import functional_joint, what_if
from tests.fixtures import real, zoo
from tests.util import eager_saved_storages

CASES = [(name, mode) for name in ("mlp", "cnn_bn", "hf_vit") for mode in ("make_fx", "aot")]


@pytest.fixture(scope="module", params=CASES, ids=[f"{n}-{m}" for n, m in CASES])
def case(request):
    name, mode = request.param
    f = zoo.FIXTURES[name] if name in zoo.FIXTURES else real.get(name)
    model, inputs = f.make_model(), f.make_inputs(4)
    return f, model, inputs, jl.trace(model, f.train_fn, inputs, mode=mode)


def _split_step(joint, model, inputs):
    """One step through the default partition's forward then backward graph."""
    gm, k, _ = functional_joint(joint)
    fwd, bwd = default_partition(copy.deepcopy(gm), [], num_fwd_outputs=k)
    flat = joint.flat_args(model, inputs)
    args = joint.runtime.prepare(joint, flat)  # aot: the loss tangent (ones) comes last
    n_primals = sum(1 for n in fwd.graph.nodes if n.op == "placeholder")
    with torch.no_grad():
        out = fwd(*args[:n_primals])
        fwd_out, saved = list(out[:k]), list(out[k:])
        if joint.mode == "make_fx":  # [loss, *loss_dict] | grads in param_names order
            grads = bwd(*saved, torch.ones_like(fwd_out[0]))
            return fwd_out[0], dict(zip(joint.param_names, grads))
        loss_pos = [kind for kind, _ in joint.runtime.out_plan].index("loss")
        grads = bwd(*saved, torch.ones_like(fwd_out[loss_pos]))
        loss, grads, _ = joint.runtime.finish(joint, [*fwd_out, *grads], flat)
    return loss, dict(zip(joint.param_names, grads))


def test_split_graphs_compute_the_same_gradients(case):
    f, model, inputs, joint = case
    bufs = {n: b.clone() for n, b in model.named_buffers()}
    loss, grads = _split_step(joint, model, inputs)
    after_split = {n: b.clone() for n, b in model.named_buffers()}
    with torch.no_grad():
        for n, b in model.named_buffers():
            b.copy_(bufs[n])
    ref_loss, ref_grads, _ = joint.run(model, inputs)
    if joint.mode == "aot":
        # the split forward returns the new running statistics exactly as run does (the
        # make_fx copy is only scored: it drops buffer write-backs, which cost no memory)
        for n, b in model.named_buffers():
            assert torch.equal(after_split[n], b), n
    with torch.no_grad():
        for n, b in model.named_buffers():
            b.copy_(bufs[n])
    assert torch.allclose(loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        assert torch.allclose(g, ref_grads[name], atol=1e-6), name


def test_save_all_matches_eager_saved_tensors(case):
    f, model, inputs, joint = case
    df = what_if(joint, budgets=(0.3,))
    save_all = df.set_index("option").loc["save all (default_partition)"]
    eager = sum(eager_saved_storages(f.train_fn, model, inputs).values())
    assert abs(save_all["saved_bytes"] - eager) <= 0.05 * eager
    traced = df.set_index("option").loc["joint graph as traced"]
    assert abs(traced["saved_bytes"] - eager) <= 0.05 * eager


def test_budgets_trade_saved_bytes(case):
    _, _, _, joint = case
    df = what_if(joint, budgets=(1.0, 0.1))
    assert "error" not in df or df["error"].isna().all()
    rows = df.set_index("option")
    full, tight = rows.loc["min-cut remat, budget 1"], rows.loc["min-cut remat, budget 0.1"]
    assert tight["saved_bytes"] <= full["saved_bytes"]
    assert tight["forward_peak_bytes"] <= full["forward_peak_bytes"]
    assert (df["peak_bytes"] >= df[["forward_peak_bytes", "backward_peak_bytes"]].max(axis=1)).all()


def test_as_traced_row_matches_the_measured_run(case):
    """The "as traced" peaks against the profiler's allocations of a real run of the graph."""
    _, model, inputs, joint = case
    row = what_if(joint, budgets=()).set_index("option").loc["joint graph as traced"]
    measured = measure(joint, model, inputs)["measured"].to_numpy()
    first_bwd = int(np.flatnonzero(joint.nodes["phase"].to_numpy() == "backward")[0])
    refs = {"peak_bytes": measured.max(), "forward_peak_bytes": measured[:first_bwd].max(),
            "backward_peak_bytes": measured[first_bwd:].max()}
    for key, ref in refs.items():
        assert abs(row[key] - ref) <= 0.01 * ref, (key, row[key], ref)


def test_a_loaded_aot_graph_is_refused_not_misread(tmp_path):
    f = zoo.FIXTURES["mlp"]
    inputs = f.make_inputs(4)
    joint = jl.trace(f.make_model(), f.train_fn, inputs, mode="aot")
    assert len(what_if(joint, budgets=())) == 2  # the traced graph itself is fine
    path = tmp_path / "g.jlg"
    joint.save(str(path))
    with pytest.raises(jl.errors.WhatIfError, match="descriptors"):
        what_if(jl.load(str(path)))


def test_a_make_fx_graph_without_its_seed_is_refused():
    f = zoo.FIXTURES["mlp"]
    inputs = f.make_inputs(4)
    joint = jl.trace(f.make_model(), f.train_fn, inputs)
    seed = next(n for n in joint.graph.nodes if "ones_like" in str(n.target))
    seed.target, seed.args = torch.ops.aten.full_like.default, (seed.args[0], 1.0)
    joint.recompute()
    with pytest.raises(jl.errors.WhatIfError, match="ones_like"):
        what_if(joint)


def test_a_profile_of_a_bare_graph_module_refuses_what_if():
    f = zoo.FIXTURES["mlp"]
    joint = jl.trace(f.make_model(), f.train_fn, f.make_inputs(4))
    with pytest.raises(jl.errors.WhatIfError, match="bare graph module"):
        predict(joint.graph_module).what_if()
    assert len(joint.memory().what_if(budgets=())) == 2  # joint.memory() binds the graph
