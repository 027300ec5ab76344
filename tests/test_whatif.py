"""What-if partitions: the functional copy is right, and saved bytes match eager autograd."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._functorch.partitioners import default_partition

import jointlab as jl
from jointlab._whatif import functional_joint, what_if
from tests.fixtures import zoo


@pytest.fixture(scope="module", params=["mlp", "cnn_bn"])
def case(request):
    f = zoo.FIXTURES[request.param]
    model, inputs = f.make_model(), f.make_inputs(4)
    return f, model, inputs, jl.trace(model, f.train_fn, inputs)


def _eager_saved_bytes(f, model, inputs):
    """Bytes of distinct storages autograd saves that are not state or inputs."""
    known = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    known |= {t.untyped_storage().data_ptr() for t in inputs.values()
              if isinstance(t, torch.Tensor)}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in known:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f.train_fn(model, **inputs)
    return sum(seen.values())


def test_split_graphs_compute_the_same_gradients(case):
    f, model, inputs, joint = case
    gm, k, _ = functional_joint(joint)
    fwd, bwd = default_partition(copy.deepcopy(gm), [], num_fwd_outputs=k)
    flat = joint.flat_args(model, inputs)
    bufs = {n: b.clone() for n, b in model.named_buffers()}
    out = fwd(*flat)
    loss, saved = out[0], list(out[k:])
    grads = bwd(*saved, torch.ones_like(loss))
    with torch.no_grad():
        for n, b in model.named_buffers():
            b.copy_(bufs[n])
    ref_loss, ref_grads, _ = joint.run(model, inputs)
    with torch.no_grad():
        for n, b in model.named_buffers():
            b.copy_(bufs[n])
    assert torch.allclose(loss, ref_loss)
    for g, name in zip(grads, joint.param_names):
        assert torch.allclose(g, ref_grads[name], atol=1e-6), name


def test_save_all_matches_eager_saved_tensors(case):
    f, model, inputs, joint = case
    df = what_if(joint, budgets=(0.3,))
    save_all = df.set_index("option").loc["save all (default_partition)"]
    eager = _eager_saved_bytes(f, model, inputs)
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
    assert rows.loc["joint graph as traced", "peak_bytes"] == joint.memory().peak_bytes
