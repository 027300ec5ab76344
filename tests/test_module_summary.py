"""module_summary: parameter counts (tied once), shapes, FLOPs and time per module."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils.flop_counter import FlopCounterMode

import jointlab as jl
from jointlab.errors import RecordError, TableQueryError
from jointlab.meta import TRAIN_FN, in_module
from tests.util import assert_unchanged, deep_state, traced_fixture, traced_real


def _shapes(tree) -> list[tuple[int, ...]]:
    return [tuple(t.shape) for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _hooked_shapes(model, run):
    """First-call input and output shapes of every module, from hooks on a copy.

    ``run(model)`` drives the copy: an eager step, or ``jl.trace`` (what the trace saw).
    """
    model = copy.deepcopy(model)
    ins, outs = {}, {}

    def pre(name):
        def fn(_m, args, kwargs):
            ins.setdefault(name, _shapes((args, kwargs)))
        return fn

    def post(name):
        def fn(_m, _args, out):
            outs.setdefault(name, _shapes(out))
        return fn

    for n, m in model.named_modules():
        m.register_forward_pre_hook(pre(n), with_kwargs=True)
        m.register_forward_hook(post(n))
    run(model)
    return ins, outs


def test_tied_weights_count_once_on_hf_gpt2():
    f, model, inputs, joint = traced_real("hf_gpt2", "make_fx")
    every_name = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    unique = sum(p.numel() for p in model.parameters())
    assert every_name > unique  # the fixture really ties lm_head to wte
    df = jl.module_summary(joint, model)
    assert df.loc["", "params"] == unique
    for name, mod in model.named_modules():
        assert df.loc[name, "params"] == sum(p.numel() for p in mod.parameters()), name
    assert "transformer.wte.weight" in df.loc["lm_head", "tied"]
    assert "lm_head.weight" in df.loc["transformer.wte", "tied"]
    assert df.loc["transformer.h.0", "tied"] == ""
    frozen = copy.deepcopy(model)
    frozen.transformer.wpe.weight.requires_grad_(False)
    dff = jl.module_summary(joint, frozen)
    assert dff.loc["", "trainable"] == sum(p.numel() for p in frozen.parameters()
                                           if p.requires_grad)
    assert dff.loc["transformer.wpe", "trainable"] == 0 < dff.loc["transformer.wpe", "params"]


@pytest.mark.parametrize("name", ["hf_gpt2", "resnet"])
def test_shapes_match_eager_hooks_and_model_is_untouched(name):
    f, model, inputs, joint = traced_real(name, "make_fx")
    model = copy.deepcopy(model)
    ins, outs = _hooked_shapes(model, lambda m: jl.trace(m, f.train_fn, inputs))
    eager_ins, eager_outs = _hooked_shapes(model, lambda m: f.train_fn(m, **inputs))
    before = deep_state(model)
    df = jl.module_summary(joint, model, inputs)
    assert_unchanged(before, model)  # parameters, buffers and the RNG
    assert df.attrs["in_shapes"] == ""
    called = df[df["calls"] > 0]
    assert len(called) > 5
    for mod, row in called.iterrows():
        assert row["in_shapes"] == ins[mod], mod
        assert row["out_shapes"] == outs[mod] == eager_outs[mod], mod
    # transformers' causal-mask shortcut is taken as eager takes it (plugins/transformers.py),
    # so the traced blocks see eager's arguments: no explicit mask where eager has none
    assert [m for m in called.index if ins[m] != eager_ins[m]] == []


def test_flops_and_bytes_cover_submodules():
    f, model, inputs, joint = traced_real("hf_gpt2", "make_fx")
    df = jl.module_summary(joint, model, depth=3)
    assert df.index.map(lambda m: len(m.split(".")) if m else 0).max() == 3
    nodes = joint.nodes
    for mod in ("", "transformer.h.0", "lm_head"):
        mask = nodes["module"].map(lambda m, mod=mod: m != TRAIN_FN and (
            mod == "" or in_module(m, mod)))
        for side, phase in (("fwd", "forward"), ("bwd", "backward")):
            sel = nodes[mask & (nodes["phase"] == phase)]
            assert df.loc[mod, f"flops_{side}"] == sel["flops"].sum(), (mod, side)
            assert df.loc[mod, f"bytes_{side}"] == sel["bytes"].sum(), (mod, side)
    block = copy.deepcopy(model.transformer.h[0])
    with FlopCounterMode(display=False) as counter:
        block(torch.randn(2, 8, model.config.n_embd))
    assert df.loc["transformer.h.0", "flops_fwd"] == counter.get_total_flops()


def test_time_columns_come_from_the_record():
    f, inputs, joint = traced_fixture("mlp", "make_fx")
    model = f.make_model()
    df = jl.module_summary(joint, model)
    assert df[["time_fwd_s", "time_bwd_s"]].isna().all().all()
    rec = jl.record(joint, model, inputs)
    df = jl.module_summary(joint, model, record=rec)
    both = joint.nodes.join(rec.table)
    fc1 = both[both["module"] == "fc1"]
    assert df.loc["fc1", "time_fwd_s"] == pytest.approx(
        fc1["time_s"][fc1["phase"] == "forward"].sum())
    assert df.loc["", "time_bwd_s"] >= df.loc["fc1", "time_bwd_s"] > 0
    _, other_in, other = traced_fixture("tiny_lm", "make_fx")
    with pytest.raises(RecordError, match="another graph"):
        jl.module_summary(other, zoo_model("tiny_lm"), record=rec)


def zoo_model(name: str):
    from tests.fixtures import zoo

    return zoo.get(name).make_model()


def _by_storage(params) -> dict[int, list[tuple[str, torch.nn.Parameter]]]:
    """Parameters grouped by the memory they live in: one group per distinct tensor."""
    groups: dict[int, list] = {}
    for name, p in params:
        groups.setdefault(p.data_ptr(), []).append((name, p))
    return groups


def test_joint_summary_by_module_counts_storages_once_on_hf_gpt2():
    f, model, inputs, joint = traced_real("hf_gpt2", "make_fx")
    frozen = copy.deepcopy(model)
    frozen.transformer.wpe.weight.requires_grad_(False)
    before = deep_state(frozen)
    table = joint.summary(by="module", model=frozen, inputs=inputs)
    assert_unchanged(before, frozen)
    assert "tied: " in table._repr_html_() and len(table) == len(list(frozen.named_modules()))
    everything = _by_storage(frozen.named_parameters(remove_duplicate=False))
    assert any(len(names) > 1 for names in everything.values())  # GPT-2 ties lm_head to wte
    for mod_name, mod in frozen.named_modules():
        own = _by_storage(mod.named_parameters(remove_duplicate=False))
        assert table.loc[mod_name, "params"] == sum(g[0][1].numel() for g in own.values())
        assert table.loc[mod_name, "trainable"] == sum(
            g[0][1].numel() for g in own.values() if g[0][1].requires_grad), mod_name
    for group in everything.values():
        names = [n for n, _ in group]
        for name in names if len(names) > 1 else ():
            owner, _, leaf = name.rpartition(".")
            others = [n for n in names if n != name]
            assert all(o in table.loc[owner, "tied"] for o in others), name
            assert table.loc[owner, "tied"].startswith(f"{leaf}=")
    untied = [m for m, mod in frozen.named_modules()
              if all(len(everything[p.data_ptr()]) == 1 for p in mod.parameters(recurse=False))]
    assert untied and all(table.loc[m, "tied"] == "" for m in untied)
    assert table.loc["transformer.h.0", "in_shapes"][0] == tuple(
        [*inputs["input_ids"].shape, model.config.n_embd])


def test_joint_summary_hand_off_refuses_mixed_arguments():
    f, inputs, joint = traced_fixture("mlp", "make_fx")
    with pytest.raises(TableQueryError, match="model="):
        joint.summary(by="op", model=f.make_model())
    with pytest.raises(TableQueryError, match="model="):
        joint.summary(inputs=inputs)
    assert "nodes_fwd" in joint.summary(by="module").columns  # without model=: the node summary


def test_loaded_graph_says_why_it_has_no_input_shapes(tmp_path):
    f, inputs, joint = traced_fixture("mlp", "make_fx")
    assert jl.module_summary(joint, f.make_model()).attrs["in_shapes"] == ""
    joint.save(tmp_path / "g.jlg")
    df = jl.module_summary(jl.load(tmp_path / "g.jlg"), f.make_model(), inputs)
    assert df["in_shapes"].isna().all() and "loaded from disk" in df.attrs["in_shapes"]
