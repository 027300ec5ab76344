"""jl.record: per-node statistics of one real step, checked against eager autograd."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import jointlab as jl
from jointlab import meta as _meta
from jointlab.errors import NodeExecutionError, RecordError, ValueNotAvailableError
from tests.fixtures import zoo
from tests.util import assert_unchanged, deep_state, eager_step


def _setup(name: str):
    f = zoo.FIXTURES[name]
    model, inputs = f.make_model(), f.make_inputs(4)
    return f, model, inputs, jl.trace(model, f.train_fn, inputs)


def _stats(t: torch.Tensor) -> dict[str, float]:
    """The reference: eager statistics over the finite elements (std with correction=0)."""
    t = t.detach().double().reshape(-1)
    fin = t[torch.isfinite(t)]
    counts = {"nan": int(torch.isnan(t).sum()), "inf": int(torch.isinf(t).sum())}
    if fin.numel() == 0:
        return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan,
                "norm": math.nan, **counts}
    return {"mean": fin.mean().item(), "std": fin.std(correction=0).item(),
            "min": fin.min().item(), "max": fin.max().item(),
            "norm": torch.linalg.vector_norm(fin).item(), **counts}


def _assert_row(row, ref: torch.Tensor, where: str) -> None:
    want = _stats(ref)
    assert row["value_shape"] == tuple(ref.shape), where
    for k in ("mean", "std", "min", "max", "norm"):
        assert row[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6, nan_ok=True), f"{where} {k}"
    assert (row["nan"], row["inf"]) == (want["nan"], want["inf"]), where


def _eager_module_outputs(model, train_fn, inputs, seed):
    """Every module call's output, from forward hooks on a copy of the model."""
    model = copy.deepcopy(model)
    outs: dict[tuple[str, int], torch.Tensor] = {}
    counts: dict[str, int] = {}

    def hook(name):
        def fn(_mod, _args, out):
            if isinstance(out, torch.Tensor):
                call = counts.get(name, 0)
                counts[name] = call + 1
                outs[(name, call)] = out.detach().clone()
        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    try:
        loss, grads, _ = eager_step(model, train_fn, inputs, seed)
    finally:
        for h in handles:
            h.remove()
    return loss, grads, outs


@pytest.mark.parametrize("name", ["tiny_lm", "mlp"])
def test_stats_match_eager_loss_grads_and_module_outputs(name):
    f, model, inputs, joint = _setup(name)
    loss, grads, outs = _eager_module_outputs(model, f.train_fn, inputs, seed=5)
    torch.manual_seed(5)  # tiny_lm has dropout: same seed, same draws
    rec = jl.record(joint, model, inputs)
    table = rec.table
    assert list(table.index) == list(joint.nodes.index)
    assert rec.loss == pytest.approx(float(loss), rel=1e-6)
    out_node = joint.graph.output_node()
    flat_out = out_node.args[0]
    _assert_row(table.loc[flat_out[0].name], loss, "loss")
    for i, fqn in enumerate(joint.param_names):
        _assert_row(table.loc[flat_out[1 + i].name], grads[fqn], f"grad of {fqn}")
        assert rec.param_grad_norms[fqn] == pytest.approx(grads[fqn].norm().item(), rel=1e-5)
    probed = 0
    for node in joint.graph.nodes:
        for fqn, call, leaf in _meta.info(node).get("probe_out", []):
            if leaf == 0 and (fqn, call) in outs:
                _assert_row(table.loc[node.name], outs[(fqn, call)], f"{fqn}#{call}")
                probed += 1
    assert probed >= 3


def test_join_with_node_table_and_notes():
    _, model, inputs, joint = _setup("tiny_lm")
    rec = jl.record(joint, copy.deepcopy(model), inputs)
    both = joint.nodes.join(rec.table)
    assert len(both) == len(joint.nodes)
    empties = both[both["target"].str.contains("empty")]
    assert len(empties) and (empties["note"] == "uninitialized").all()
    assert empties["mean"].isna().all() and empties["nan"].isna().all()
    compute = both[both["phase"].isin(["forward", "backward"]) & (both["note"] == "")]
    assert (compute["time_s"] >= 0).all() and compute["time_s"].sum() > 0
    assert "Record(" in repr(rec) and len(repr(rec)) < 200


def test_injected_nan_and_inf_are_counted_like_eager():
    f, model, inputs, joint = _setup("mlp")
    bad = dict(inputs, x=inputs["x"].clone())
    bad["x"][0, 3] = float("nan")
    bad["x"][2, 5] = float("inf")
    loss, grads, outs = _eager_module_outputs(model, f.train_fn, bad, seed=0)
    rec = jl.record(joint, model, bad)
    x_node = next(n for n in joint.placeholders if _meta.info(n).get("input_path") == "x")
    _assert_row(rec.table.loc[x_node.name], bad["x"], "x")
    assert rec.table.loc[x_node.name, "nan"] == 1 and rec.table.loc[x_node.name, "inf"] == 1
    fc1 = next(n for n in joint.graph.nodes
               if ["fc1", 0, 0] in _meta.info(n).get("probe_out", []))
    _assert_row(rec.table.loc[fc1.name], outs[("fc1", 0)], "fc1 output")
    assert rec.table.loc[fc1.name, "nan"] > 0
    w = joint.param_names.index("fc1.weight")
    g = joint.graph.output_node().args[0][1 + w]
    _assert_row(rec.table.loc[g.name], grads["fc1.weight"], "fc1.weight grad")


def test_keep_bytes_keeps_values_in_graph_order_within_budget():
    f, model, inputs, joint = _setup("mlp")
    _, _, outs = _eager_module_outputs(model, f.train_fn, inputs, seed=0)
    fc2 = next(n for n in joint.graph.nodes if ["fc2", 0, 0] in _meta.info(n).get("probe_out", []))
    budget = 4096
    rec = jl.record(joint, model, inputs, keep_bytes=budget)
    kept = rec.table[rec.table["kept"]]
    assert 0 < rec._kept_bytes() <= budget and list(kept.index) == list(rec.values)
    big = jl.record(joint, model, inputs, keep_bytes=1 << 30)
    torch.testing.assert_close(big.value(fc2.name), outs[("fc2", 0)])
    with pytest.raises(ValueNotAvailableError, match="keep_bytes"):
        jl.record(joint, model, inputs).value(fc2.name)
    with pytest.raises(ValueNotAvailableError, match="no node"):
        big.value("nope")
    with pytest.raises(RecordError):
        jl.record(joint, model, inputs, keep_bytes=-1)


def test_record_leaves_model_and_graph_alone():
    _, model, inputs, joint = _setup("mlp")
    before, code = deep_state(model), joint.graph_module.code
    jl.record(joint, model, inputs, keep_bytes=1 << 20)
    assert_unchanged(before, model)
    assert joint.graph_module.code == code


def test_grad_norm_per_module_matches_eager():
    f, model, inputs, joint = _setup("tiny_lm")
    _, grads, _ = eager_step(copy.deepcopy(model), f.train_fn, inputs, seed=1)
    torch.manual_seed(1)
    rec = jl.record(joint, copy.deepcopy(model), inputs)
    by_block = rec.grad_norm(depth=2)
    want = math.sqrt(sum(g.double().norm().item() ** 2 for k, g in grads.items()
                         if k.startswith("h.0.")))
    assert by_block.loc["h.0", "grad_norm"] == pytest.approx(want, rel=1e-5)
    own = rec.grad_norm()
    assert own.loc["h.0.attn.qkv", "params"] == 2
    with pytest.raises(RecordError):
        rec.grad_norm(depth=-1)


def test_failing_node_is_named():
    _, model, inputs, joint = _setup("mlp")
    node = next(n for n in joint.graph.nodes if _meta.op_name(n) == "relu")
    node.target = torch.ops.aten.linalg_inv.default  # a non-square input: raises (aten.cholesky
    # is gone in torch 2.15)
    joint.graph_module.recompile()
    with pytest.raises(NodeExecutionError, match=node.name):
        jl.record(joint, model, inputs)


class _WritesThroughView(torch.nn.Module):
    """A view taken before an in-place write, read after it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 12).reshape(3, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        v = y.t()
        y.mul_(3.0)
        w = v.reshape(-1)
        return (w * self.w.t().reshape(-1)).sum()


def test_view_read_after_an_inplace_write_gets_the_written_values():
    model = _WritesThroughView()
    inputs = {"x": torch.arange(12.0).reshape(3, 4)}
    joint = jl.trace(model, lambda m, x: m(x), inputs)
    rec = jl.record(joint, model, inputs)
    t = next(n for n in joint.graph.nodes if _meta.op_name(n) == "t")
    copy_of_t = next(n for n in t.users if _meta.op_name(n) == "clone")
    assert rec.table.loc[t.name, "max"] == 11.0  # when t ran
    _assert_row(rec.table.loc[copy_of_t.name], 3 * inputs["x"].t(), "t after mul_")


def test_every_row_matches_torch_reductions_of_the_kept_value():
    """Reused statistics (views, expand) and computed ones alike, on every node."""
    _, model, inputs, joint = _setup("tiny_lm")
    small = _WritesThroughView()
    small_in = {"x": torch.arange(12.0).reshape(3, 4)}
    cases = [(joint, copy.deepcopy(model), inputs),
             (jl.trace(small, lambda m, x: m(x), small_in), small, small_in)]
    checked: dict[str, int] = {}
    for joint, model, inputs in cases:
        rec = jl.record(joint, model, inputs, keep_bytes=1 << 30)
        table = rec.table
        for node in joint.graph.nodes:
            row = table.loc[node.name]
            if row["note"] == "" and node.name in rec.values:
                _assert_row(row, rec.values[node.name], node.name)
                checked[_meta.op_name(node)] = checked.get(_meta.op_name(node), 0) + 1
        assert table["note"].isin(["", "uninitialized", "not a tensor", "not run"]).all()
    assert checked["expand"] and checked["t"] and checked["view"] and checked["mm"]


def _eager_output_grads(model, train_fn, inputs, seed):
    """Eager gradients of every parameter and of every module call's output (tensor hooks)."""
    model = copy.deepcopy(model)
    out_grads: dict[tuple[str, int], torch.Tensor] = {}
    counts: dict[str, int] = {}

    def hook(name):
        def fn(_mod, _args, out):
            if isinstance(out, torch.Tensor) and out.requires_grad:
                call = counts.get(name, 0)
                counts[name] = call + 1
                out.register_hook(lambda g: out_grads.setdefault((name, call), g.detach()))
        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()]
    try:
        _, grads, _ = eager_step(model, train_fn, inputs, seed)
    finally:
        for h in handles:
            h.remove()
    return grads, out_grads


def _eager_grad_norms(joint, grads, out_grads) -> dict[str, float]:
    """The reference norm of every gradient node: eager's parameter or module-output gradient."""
    want: dict[str, float] = {}
    for fqn, nodes in joint.grad_terms().items():
        if len(nodes) == 1:  # a sole term is the whole gradient (alias terms: see the test)
            want[nodes[0].name] = torch.linalg.vector_norm(grads[fqn].double()).item()
    for node in joint.graph.nodes:
        for fqn, call, leaf in _meta.info(node).get("probe_grad", []):
            if leaf == 0 and (fqn, call) in out_grads and node.name not in want:
                want[node.name] = torch.linalg.vector_norm(out_grads[(fqn, call)].double()).item()
    return want


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_layers_hold_eager_gradient_and_value_norms(mode):
    f = zoo.FIXTURES["tiny_lm"]
    model, inputs = f.make_model(), f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs, mode=mode)
    grads, out_grads = _eager_output_grads(model, f.train_fn, inputs, seed=3)
    _, _, outs = _eager_module_outputs(model, f.train_fn, inputs, seed=3)
    torch.manual_seed(3)  # dropout: same seed, same draws
    rec = jl.record(joint, copy.deepcopy(model), inputs, keep_bytes=1 << 24)
    layers = rec.layers()
    assert set(layers) == {"grad norm", "value norm", "nan/inf"}
    want = _eager_grad_norms(joint, grads, out_grads)
    # AOT gives a tied weight one gradient per alias: terms that add up to eager's gradient
    terms: dict[str, list[str]] = {}
    for node, what in rec.gradients.items():
        if "alias terms" in what:
            terms.setdefault(what.split(" ")[0], []).append(node)
    assert bool(terms) == (mode == "aot")
    for fqn, parts in terms.items():
        assert len(parts) > 1
        torch.testing.assert_close(sum(rec.value(n) for n in parts), grads[fqn])
        want.update({n: torch.linalg.vector_norm(rec.value(n).double()).item() for n in parts})
    by_name = {n.name: n for n in joint.graph.nodes}
    probed = [n for n in want if _meta.info(by_name[n]).get("probe_grad")]
    assert len(probed) >= 5 and len(want) > len(probed)
    assert set(layers["grad norm"]) == set(want)
    for name, norm in want.items():
        assert layers["grad norm"][name] == pytest.approx(norm, rel=1e-5), name
    checked = 0
    for node in joint.graph.nodes:
        for fqn, call, leaf in _meta.info(node).get("probe_out", []):
            if leaf == 0 and (fqn, call) in outs:
                ref = torch.linalg.vector_norm(outs[(fqn, call)].double()).item()
                assert layers["value norm"][node.name] == pytest.approx(ref, rel=1e-5), fqn
                checked += 1
    assert checked >= 3
    assert set(layers["grad norm"]) <= set(layers["value norm"])
    assert set(layers["nan/inf"].values()) == {0}


def test_collapsed_module_shows_its_largest_eager_gradient():
    from jointlab.viz.dagview import build_payload

    f, model, inputs, joint = _setup("tiny_lm")
    grads, out_grads = _eager_output_grads(model, f.train_fn, inputs, seed=4)
    torch.manual_seed(4)
    rec = jl.record(joint, copy.deepcopy(model), inputs)
    payload = build_payload(joint, layers=rec.layers())
    layer, groups = payload["layers"]["grad norm"], payload["groups"]["name"]
    want = _eager_grad_norms(joint, grads, out_grads)
    module = {n.name: _meta.info(n).get("module", "") for n in joint.graph.nodes}
    for mod in ("h.0", "h.1.attn", "h.0.mlp"):
        ref = max(v for n, v in want.items() if _meta.in_module(module[n], mod))
        assert layer["gb"][groups.index(mod)] == pytest.approx(ref, rel=1e-5), mod
        assert layer["gf"][groups.index(mod)] is None  # no gradient in the forward band


def test_nan_and_inf_values_have_no_norm_and_are_counted():
    f, model, inputs, joint = _setup("mlp")
    bad = dict(inputs, x=inputs["x"].clone())
    bad["x"][0, 3] = float("nan")
    bad["x"][2, 5] = float("inf")
    grads, out_grads = _eager_output_grads(model, f.train_fn, bad, seed=0)
    _, _, outs = _eager_module_outputs(model, f.train_fn, bad, seed=0)
    rec = jl.record(joint, model, bad)
    layers = rec.layers()
    x_node = next(n for n in joint.placeholders if _meta.info(n).get("input_path") == "x")
    fc1 = next(n for n in joint.graph.nodes
               if ["fc1", 0, 0] in _meta.info(n).get("probe_out", []))
    g_node = joint.params_and_grads()["fc1.weight"][1]
    for node, ref in ((x_node, bad["x"]), (fc1, outs[("fc1", 0)]), (g_node, grads["fc1.weight"])):
        count = int((~torch.isfinite(ref)).sum())
        assert count > 0 and layers["nan/inf"][node.name] == count, node.name
        assert node.name not in layers["value norm"] and node.name not in layers["grad norm"]
    weight = joint.params_and_grads()["fc1.weight"][0]  # a clean value: the parameter itself
    assert layers["nan/inf"][weight.name] == 0
    assert layers["value norm"][weight.name] == pytest.approx(
        torch.linalg.vector_norm(model.fc1.weight.double()).item(), rel=1e-6)
