"""Node tables: columns, numbers against independent references, summaries, cache, card."""

from __future__ import annotations

import copy
import re

import pandas as pd
import pytest
import torch
import torch.fx as fx
from torch.utils.flop_counter import FlopCounterMode, flop_registry

import jointlab as jl
from jointlab.analysis.tables import COLUMNS, node_table
from jointlab.errors import JointlabError, TableQueryError
from jointlab.meta import DEFAULTS, KEY, TRAIN_FN, NodeInfo, node_info
from jointlab.passes.analyze import ensure_analyzed
from jointlab.torch_compat import flop_formula
from tests.fixtures import zoo
from tests.util import eager_saved_storages, node_values, traced_zoo

BATCH = 4
MODES = ["make_fx", "aot"]
NAMES = ["mlp", "cnn_bn", "tiny_lm", "nested_inputs", "unused_param", "shared_submodule"]
#: CPU flash attention, forward and backward: torch's counter has formulas since 2.15.
CPU_FLASH = [getattr(torch.ops.aten, f"_scaled_dot_product_flash_attention_for_cpu{s}")
             for s in ("", "_backward")]


def traced(name: str, mode: str = "make_fx"):
    """(model, inputs, joint) of a zoo fixture, traced once per test session (read-only)."""
    _, model, inputs, joint = traced_zoo(name, mode, BATCH)
    return model, inputs, joint


def fresh(name: str, mode: str = "make_fx"):
    """A new trace, for tests that edit the graph."""
    fx_ = zoo.FIXTURES[name]
    model, inputs = fx_.make_model(), fx_.make_inputs(BATCH)
    return model, inputs, jl.trace(model, fx_.train_fn, inputs, mode=mode)


# -- shape of the table --------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_one_row_per_node_in_graph_order(mode):
    _, _, joint = traced("tiny_lm", mode)
    df = joint.nodes
    assert list(df.columns) == list(COLUMNS)
    assert list(df.index) == [n.name for n in joint.graph.nodes]
    assert set(df["phase"]) <= {"param", "buffer", "input", "forward", "backward", "output"}
    assert set(df["category"]) <= {"matmul", "conv", "pointwise", "reduction", "view", "norm",
                                    "rng", "copy", "collective", "other"}
    mm = df[df["target"] == "aten.mm"]
    assert len(mm) > 0 and (mm["category"] == "matmul").all()
    for n in joint.graph.nodes:
        row = df.loc[n.name]
        assert row["op"] == n.op
        assert row["num_users"] == len(n.users)
        assert row["args"] == tuple(a.name for a in n.all_input_nodes)
        assert row["phase"] == n.meta[KEY]["phase"]
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            assert row["shape"] == tuple(val.shape)
            assert row["dtype"] == str(val.dtype).removeprefix("torch.")


def test_cached_and_pure_reader():
    _, _, joint = fresh("mlp")
    ensure_analyzed(joint.graph_module)
    before = {n.name: copy.deepcopy(n.meta[KEY]) for n in joint.graph.nodes}
    df = joint.nodes
    assert joint.nodes is df
    assert {n.name: n.meta[KEY] for n in joint.graph.nodes} == before


def test_stack_trace_points_at_user_code():
    _, _, joint = traced("mlp")
    fwd = joint.nodes[joint.nodes["phase"] == "forward"]
    mm = fwd[fwd["category"] == "matmul"]
    assert len(mm) == 3
    assert all(re.fullmatch(r"zoo\.py:\d+", s) for s in mm["stack_trace"])


# -- the numbers against independent references ----------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_total_flops_match_flop_counter(name, mode):
    _, _, joint = traced(name, mode)
    fixture = zoo.FIXTURES[name]
    model, inputs = fixture.make_model(), fixture.make_inputs(BATCH)
    # torch < 2.15's counter has no CPU flash-attention formula: give it 2.15's (which
    # test_flops_attention checks against the hand count and torch 2.15's own counter)
    late = {p: flop_formula(p).__wrapped__ for p in CPU_FLASH if p not in flop_registry}
    with FlopCounterMode(display=False, custom_mapping=late) as counter:
        out = fixture.train_fn(model, **inputs)
        (out[0] if isinstance(out, tuple) else out).backward()
    ref = counter.get_total_flops()
    assert ref > 0
    assert joint.nodes["flops"].sum() == pytest.approx(ref, rel=0.01)
    assert not joint.nodes["flops_unknown"].any()


# cnn_bn and tiny_lm (NLL loss, dropout) are checked per module against autograd's
# saved tensors in tests/test_saved.py, whose reference also attributes multi-output
# storages; this simpler storage-size check covers the models without them.
_SIMPLE = ("mlp", "shared_submodule")


def _saved_roots(joint) -> list[str]:
    """Storage owners of the saved-for-backward rows, less state, inputs and the loss seed."""
    df = joint.nodes
    roots = set()
    for name in df.index[df["saved_for_backward"]]:
        while isinstance(df.loc[name, "alias_of"], str):
            name = df.loc[name, "alias_of"]
        roots.add(name)
    loss = joint.graph.output_node().args[0][0].name  # ones_like(loss) seeds the backward
    nodes = {n.name: n for n in joint.graph.nodes}
    return [r for r in roots if df.loc[r, "phase"] == "forward" and r != loss
            and not isinstance(nodes[r].meta.get("val"), (tuple, list))]


# make_fx records autograd's own backward formulas, so its forward->backward edges are
# exactly the tensors autograd saves (AOT mode decomposes first and saves other tensors).
@pytest.mark.parametrize("name", _SIMPLE)
def test_saved_for_backward_storages_are_autograds_saved_tensors(name):
    model, inputs, joint = traced(name, "make_fx")
    eager = eager_saved_storages(zoo.FIXTURES[name].train_fn, copy.deepcopy(model), inputs)
    df = joint.nodes
    assert sorted(df.loc[r, "bytes"] for r in _saved_roots(joint)) == sorted(eager.values())


@pytest.mark.parametrize("name", _SIMPLE)
def test_saved_bytes_are_autograds_saved_bytes(name):
    model, inputs, joint = traced(name, "make_fx")
    f = zoo.FIXTURES[name]
    eager = eager_saved_storages(f.train_fn, copy.deepcopy(model), inputs)
    # the backward's seed, ones_like(loss), reads only the loss's size: nothing is saved
    assert joint.summary(by="phase").loc["forward", "saved_bytes"] == sum(eager.values())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["mlp", "cnn_bn", "tiny_lm", "shared_submodule"])
def test_bytes_and_aliases_match_a_real_run(name, mode):
    model, inputs, joint = traced(name, mode)
    values = node_values(joint, model, inputs)
    df = joint.nodes
    seen: set[int] = set()
    fresh_rows = views = 0
    for n in joint.graph.nodes:
        v, row = values.get(n.name), df.loc[n.name]
        if isinstance(v, (tuple, list)):
            assert row["bytes"] == 0  # each getitem owns its part
            continue
        if not isinstance(v, torch.Tensor) or v.numel() == 0:
            continue
        ptr = v.untyped_storage().data_ptr()
        if row["is_view"]:
            src = values[row["alias_of"]]
            assert src.untyped_storage().data_ptr() == ptr, n.name
            assert row["bytes"] == 0
            views += 1
        else:
            assert ptr not in seen, f"{n.name} claims a new allocation but reuses a storage"
            assert row["bytes"] == v.numel() * v.element_size(), n.name
            assert v.untyped_storage().nbytes() >= row["bytes"]
            assert pd.isna(row["alias_of"])
            fresh_rows += 1
        seen.add(ptr)
    assert fresh_rows > 0 and views > 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_backward_ops_name_a_module(name, mode):
    model, _, joint = traced(name, mode)
    classes = {k: type(m).__name__ for k, m in model.named_modules(remove_duplicate=False)}
    bwd = joint.nodes[joint.nodes["phase"] == "backward"]
    named = [
        (mod == TRAIN_FN) or (mod in classes and classes[mod] == mtype)
        for mod, mtype in zip(bwd["module"], bwd["module_type"])
    ]
    assert len(bwd) > 0
    assert sum(named) / len(bwd) >= 0.95


# -- cache invalidation ------------------------------------------------------------------
def _first(graph: fx.Graph, target) -> fx.Node:
    return next(n for n in graph.nodes if n.target is target)


def test_table_follows_inserted_node():
    _, _, joint = fresh("mlp")
    before = joint.nodes
    gelu = _first(joint.graph, torch.ops.aten.gelu.default)
    with joint.graph.inserting_after(gelu):
        neg = joint.graph.call_function(torch.ops.aten.neg.default, (gelu,))
    neg.meta["val"] = torch.ops.aten.neg.default(gelu.meta["val"])
    with pytest.raises(jl.errors.StaleAnalysisError, match=r"joint\.recompute\(\)"):
        joint.nodes  # noqa: B018  # an edited graph is refused until recompute()
    joint.recompute()
    after = joint.nodes
    assert after is not before and len(after) == len(before) + 1
    assert after.loc[neg.name, "target"] == "aten.neg"
    assert after.loc[neg.name, "category"] == "pointwise"
    assert after.loc[neg.name, "bytes"] == gelu.meta["val"].numel() * 4
    assert after.loc[gelu.name, "num_users"] == before.loc[gelu.name, "num_users"] + 1
    assert list(after.index).index(neg.name) == list(after.index).index(gelu.name) + 1


def test_table_follows_replaced_target():
    _, _, joint = fresh("mlp")
    gelu = _first(joint.graph, torch.ops.aten.gelu.default)
    assert joint.nodes.loc[gelu.name, "target"] == "aten.gelu"
    gelu.target = torch.ops.aten.relu.default
    joint.recompute()
    assert joint.nodes.loc[gelu.name, "target"] == "aten.relu"


def test_analysis_restamps_on_edit():
    _, _, joint = fresh("tiny_lm")
    gm = joint.graph_module
    ensure_analyzed(gm)
    fwd = next(n for n in gm.graph.nodes
               if n.meta[KEY]["phase"] == "forward" and not n.meta[KEY]["saved_for_backward"]
               and isinstance(n.meta.get("val"), torch.Tensor))
    with gm.graph.inserting_before(gm.graph.output_node()):
        reader = gm.graph.call_function(torch.ops.aten.neg.default, (fwd,))
    reader.meta[KEY] = {"phase": "backward", "module": "", "module_type": "", "source": ""}
    ensure_analyzed(gm)
    assert fwd.meta[KEY]["saved_for_backward"]
    assert joint.nodes.loc[fwd.name, "saved_for_backward"]
    gm.graph.erase_node(reader)
    ensure_analyzed(gm)
    assert not fwd.meta[KEY]["saved_for_backward"]
    assert not joint.nodes.loc[fwd.name, "saved_for_backward"]


# -- summaries and selection ---------------------------------------------------------------
def test_summary_by_module_adds_up():
    _, _, joint = traced("tiny_lm")
    df = joint.nodes
    s = joint.summary()
    assert list(s.columns) == ["nodes_fwd", "nodes_bwd", "flops_fwd", "flops_bwd",
                               "bytes_fwd", "bytes_bwd", "saved_bytes", "flops_unknown"]
    fwd, bwd = df[df["phase"] == "forward"], df[df["phase"] == "backward"]
    assert s["nodes_fwd"].sum() == len(fwd) and s["nodes_bwd"].sum() == len(bwd)
    assert s["flops_fwd"].sum() == fwd["flops"].sum()
    assert s["flops_bwd"].sum() == bwd["flops"].sum()
    assert s["bytes_bwd"].sum() == bwd["bytes"].sum()
    assert s["saved_bytes"].sum() == df["bytes"][df["saved_for_backward"]].sum()
    qkv = df[df["module"] == "h.0.attn.qkv"]
    assert s.loc["h.0.attn.qkv", "flops_bwd"] == qkv["flops"][qkv["phase"] == "backward"].sum()
    # a linear layer's backward costs twice its forward (grad input + grad weight)
    assert s.loc["h.0.attn.qkv", "flops_bwd"] == 2 * s.loc["h.0.attn.qkv", "flops_fwd"] > 0
    assert TRAIN_FN in s.index


def test_summary_depth_merges_submodules():
    _, _, joint = traced("tiny_lm")
    full, d2 = joint.summary(), joint.summary(depth=2)
    inside = [m for m in full.index if m == "h.0" or m.startswith("h.0.")]
    assert len(inside) > 1
    assert d2.loc["h.0"].equals(full.loc[inside].sum())
    assert "h.0.attn" not in d2.index
    assert joint.summary(depth=0).index.tolist() == ["", TRAIN_FN]


def test_summary_by_phase_and_op():
    _, _, joint = traced("cnn_bn")
    df = joint.nodes
    by_phase = joint.summary(by="phase")
    assert by_phase["nodes"].sum() == len(df)
    assert by_phase.loc["backward", "flops"] == df["flops"][df["phase"] == "backward"].sum()
    assert by_phase.loc["param", "flops"] == 0
    by_op = joint.summary(by="op")
    assert by_op.loc["aten.convolution", "nodes_fwd"] == 2
    assert by_op.loc["aten.convolution_backward", "nodes_bwd"] == 2
    total = by_op["flops_fwd"] + by_op["flops_bwd"]
    assert total.is_monotonic_decreasing and total.sum() == df["flops"].sum()


def test_select_filters():
    _, _, joint = traced("tiny_lm")
    df = joint.nodes
    attn_bwd = joint.select(module="h.0.attn", phase="backward")
    assert len(attn_bwd) > 0
    assert (attn_bwd["phase"] == "backward").all()
    assert all(m == "h.0.attn" or m.startswith("h.0.attn.") for m in attn_bwd["module"])
    assert "h.0.attn.qkv" in set(attn_bwd["module"])
    assert len(joint.select(module="h.0")) > len(joint.select(module="h.0.attn"))
    assert all(m == "h.1" or m.startswith("h.1.") for m in joint.select(module="h.1")["module"])
    with pytest.raises(TableQueryError, match="'h.10'"):  # no h.10 here: not h.1's rows
        joint.select(module="h.10")
    mm = joint.select(op="aten.mm")
    assert len(mm) == (df["target"] == "aten.mm").sum() > 0
    assert joint.select(op="mm").equals(mm)
    assert joint.select().equals(df)


def test_select_refuses_a_module_that_names_nothing_and_suggests_the_full_name():
    """The README's ``select(module="h.0.attn")`` on a model that nests it (HF GPT-2's
    ``transformer.h.0.attn``) raised nothing and returned 0 rows: it must name the module."""
    _, _, joint = traced("tiny_lm")
    with pytest.raises(TableQueryError, match=r"'h\.0\.atn'.*Did you mean 'h\.0\.attn'"):
        joint.select(module="h.0.atn")
    nested = {m: "transformer." + m for m in joint.nodes["module"] if m and m != TRAIN_FN}
    renamed = joint.nodes.assign(module=joint.nodes["module"].replace(nested))
    from jointlab.analysis import tables
    with pytest.raises(TableQueryError, match=r"Did you mean 'transformer\.h\.0\.attn'"):
        tables._check_module("h.0.attn", renamed["module"],
                             tables.module_mask(renamed["module"], "h.0.attn"))
    assert len(joint.select(module="h.0", op="aten.nonexistent_op_name")) == 0  # only module


@pytest.mark.parametrize("kwargs", [{"phase": "fwd"}, {"module": 3}])
def test_select_rejects_bad_arguments(kwargs):
    _, _, joint = traced("mlp")
    with pytest.raises(TableQueryError):
        joint.select(**kwargs)


@pytest.mark.parametrize("kwargs", [{"by": "layer"}, {"depth": -1}, {"depth": 1.5}])
def test_summary_rejects_bad_arguments(kwargs):
    _, _, joint = traced("mlp")
    with pytest.raises(JointlabError, match="by|depth"):
        joint.summary(**kwargs)


# -- the notebook card --------------------------------------------------------------------
def test_card_shows_the_facts_and_stays_small():
    model, _, small = traced("mlp")
    _, _, big = traced("tiny_lm")
    card = small._repr_html_()
    n_params = sum(p.numel() for p in model.parameters())
    assert f"{n_params:,}" in card
    assert "forward" in card and "backward" in card and "saved" in card
    assert f"{len(small.graph.nodes):,}" in card
    assert len(big._repr_html_()) < 2000
    assert abs(len(big._repr_html_()) - len(card)) < 100


def test_card_escapes_model_strings():
    _, _, joint = fresh("mlp")
    joint.mode = "<script>alert(1)</script>"
    card = joint._repr_html_()
    assert "<script>" not in card and "&lt;script&gt;" in card


def test_node_table_direct_call_matches_cached():
    # the reference is built on an independent trace that never had a cache
    _, _, never_cached = fresh("cnn_bn")
    reference = node_table(never_cached)
    _, _, joint = fresh("cnn_bn")
    cached = joint.nodes
    # seq_nr is torch's process-wide autograd counter: it differs between two traces
    pd.testing.assert_frame_equal(cached.drop(columns="seq_nr"), reference.drop(columns="seq_nr"))
    direct = node_table(joint)
    assert direct is not cached  # a direct call builds the table, it does not read the cache
    pd.testing.assert_frame_equal(direct, cached)
    # ... so after an edit and recompute, the direct call and the cache both show it
    relu = _first(joint.graph, torch.ops.aten.relu.default)
    relu.target = torch.ops.aten.gelu.default
    joint.recompute()
    assert node_table(joint).loc[relu.name, "target"] == "aten.gelu"
    assert joint.nodes.loc[relu.name, "target"] == "aten.gelu"



# -- one op-name helper, typed meta, unknown FLOPs -------------------------------------------
def test_select_by_op_accepts_every_spelling_of_the_overload():
    _, _, joint = traced("tiny_lm")
    want = [n.name for n in joint.graph.nodes if n.target is torch.ops.aten.mm.default]
    assert want
    for spelling in ("aten.mm.default", "aten.mm", "mm", "mm.default"):
        assert list(joint.select(op=spelling).index) == want, spelling


def test_node_info_reads_the_annotations_with_one_default():
    _, _, joint = traced("mlp")
    for node in joint.graph.nodes:
        m, raw = node_info(node), node.meta[KEY]
        assert (m.phase, m.module, m.bytes, m.storage) == (
            raw["phase"], raw["module"], raw["bytes"], raw["storage"])
    bare = torch.fx.Graph().placeholder("x")
    assert node_info(bare) == NodeInfo()
    assert node_info(bare).category == DEFAULTS["category"] == "other"


def test_a_failing_flop_formula_is_unknown_not_zero(monkeypatch):
    from torch.utils.flop_counter import flop_registry

    def broken(*args, **kwargs):
        raise RuntimeError("formula cannot handle these shapes")

    monkeypatch.setitem(flop_registry, torch.ops.aten.mm, broken)
    _, _, joint = fresh("tiny_lm")
    mm = {n.name for n in joint.graph.nodes if n.target is torch.ops.aten.mm.default}
    df = joint.nodes
    assert mm and set(df.index[df["flops_unknown"]]) == mm
    assert (df.loc[sorted(mm), "flops"] == 0).all()
    by_phase = joint.summary(by="phase")
    assert by_phase["flops_unknown"].sum() == len(mm)
    assert joint.summary()["flops_unknown"].sum() == len(mm)
    assert "unknown" in joint._repr_html_()
    monkeypatch.undo()
    joint.recompute()
    assert not joint.nodes["flops_unknown"].any() and "unknown" not in joint._repr_html_()
