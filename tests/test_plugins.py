"""Plug-ins at the edges: the watch table's registration, and a tracer without a plug-in.

Each plug-in (``jointlab/plugins/``) registers rows of the watch table. With one
unregistered the generic tracer still traces any model exactly (checked against
eager autograd), and only that plug-in's family loses what it gave.
"""

from __future__ import annotations

import contextlib
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.plugins import BUILTIN, mha_fast_path, onednn_rnn
from jointlab.plugins import transformers as hf_plugin
from jointlab.trace import watch_table
from tests.util import assert_same_bits, eager_step

NAMES = ("transformers", "onednn rnn", "mha fast path")


def _names() -> list[str]:
    return [w.name for w in watch_table.WATCHES]


def test_builtin_plugins_register_their_rows_after_the_named_row():
    assert watch_table.plugins() == NAMES
    names = _names()
    plugin_rows = {w.name: p.NAME for p in BUILTIN for w in p.ROWS}
    for i, plugin in enumerate(BUILTIN):
        own = [w.name for w in plugin.ROWS]
        at = names.index(own[0])
        assert names[at:at + len(own)] == own
        # right after its row, or after rows of plug-ins registered later at the same row
        between = names[names.index(plugin.AFTER) + 1:at]
        later = {p.NAME for p in BUILTIN[i + 1:] if p.AFTER == plugin.AFTER}
        assert all(plugin_rows.get(n) in later for n in between), (plugin.NAME, between)
    assert [w for w in watch_table.WATCHES if w in watch_table.CORE] == list(watch_table.CORE)


def test_unregistered_drops_only_that_plugins_rows_and_puts_them_back():
    before = watch_table.WATCHES
    with watch_table.unregistered("transformers"):
        assert watch_table.plugins() == NAMES[1:]
        assert not {w.name for w in hf_plugin.ROWS} & set(_names())
        assert "fused fast path" in _names()
    assert watch_table.WATCHES == before and watch_table.plugins() == NAMES
    with pytest.raises(KeyError, match="no plug-in 'nope'"):
        with watch_table.unregistered("nope"):
            pass


def test_a_bad_registration_is_refused_and_leaves_the_table_as_it_was():
    before = watch_table.WATCHES
    row = watch_table.Watch("extra", "an event", "warn", None, "a doc", lambda c: _null())
    with pytest.raises(ValueError, match="row 'no such row'"):
        watch_table.register("extra", (row,), after="no such row")
    clash = watch_table.Watch("random ops", "an event", "warn", None, "a doc",
                              lambda c: _null())
    with pytest.raises(ValueError, match="already in the table"):
        watch_table.register("extra", (clash,), after="random ops")
    assert watch_table.WATCHES == before and "extra" not in watch_table.plugins()


def _null():
    return contextlib.nullcontext()


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_a_plain_model_traces_exactly_without_any_plugin(mode):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    inputs = {"x": torch.randn(3, 8), "y": torch.randn(3, 4)}

    def fn(m, x, y):
        return F.mse_loss(m(x), y)

    with contextlib.ExitStack() as stack:
        for plugin in BUILTIN:
            stack.enter_context(watch_table.unregistered(plugin.NAME))
        assert watch_table.plugins() == () and watch_table.retargets() == {}
        joint = jl.trace(model, fn, inputs, mode=mode)
        got = joint.run(model, inputs)
    want = eager_step(model, fn, inputs, seed=0)
    assert torch.equal(got[0], want[0])
    assert want[1] and all(torch.equal(got[1][k], want[1][k]) for k in want[1])


def test_without_the_fast_path_plugin_an_eval_encoder_is_not_refused():
    """The refusal is the plug-in's: without it the trace goes through (and would differ)."""
    enc = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).requires_grad_(False).eval()
    model = nn.ModuleDict({"enc": enc, "head": nn.Linear(16, 4)}).eval()
    inputs = {"x": torch.randn(2, 5, 16), "y": torch.randn(2, 5, 4)}

    def fn(m, x, y):
        return F.mse_loss(m["head"](m["enc"](x)), y)

    assert mha_fast_path.encoder_layer_takes_fast_path(enc, inputs["x"])
    with pytest.raises(jl.errors.FastPathError):
        jl.trace(copy.deepcopy(model), fn, inputs)
    with watch_table.unregistered("mha fast path"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jl.trace(copy.deepcopy(model), fn, inputs)


def _targets(joint) -> set[str]:
    return {str(n.target) for n in joint.graph_module.graph.nodes if n.op == "call_function"}


def test_without_the_onednn_rnn_plugin_an_lstm_graph_fails_to_run_under_no_grad():
    """The retarget row is the plug-in's: without it the graph keeps aten.mkldnn_rnn_layer,
    whose workspace is missing under joint.run's no_grad, so its backward node fails."""
    torch.manual_seed(0)
    model = nn.LSTM(4, 8, batch_first=True)
    inputs = {"x": torch.randn(2, 3, 4), "y": torch.randn(2, 3, 8)}

    def fn(m, x, y):
        return F.mse_loss(m(x)[0], y)

    joint = jl.trace(model, fn, inputs)
    assert "jointlab.mkldnn_rnn_layer.default" in _targets(joint)
    assert_same_bits(joint.run(model, inputs)[1], eager_step(model, fn, inputs, seed=0)[1],
                     "grads with the plug-in")
    with watch_table.unregistered("onednn rnn"):
        assert watch_table.retargets() == {}
        assert not {w.name for w in onednn_rnn.ROWS} & set(_names())
        joint = jl.trace(model, fn, inputs)
        assert "aten.mkldnn_rnn_layer.default" in _targets(joint)
        with pytest.raises(jl.errors.NodeExecutionError, match="mkldnn_rnn_layer_backward"):
            joint.run(model, inputs)


def test_without_the_transformers_plugin_only_hf_models_lose_its_help():
    """An HF causal LM in mode='aot' needs the plug-in's is_tracing patch; a plain model not."""
    pytest.importorskip("transformers")
    from tests.fixtures import real

    model, inputs = real.get("hf_gpt2").make_model(), real.lm_inputs()
    with watch_table.unregistered("transformers"):
        with pytest.raises(jl.errors.DataDependentError):
            jl.trace(model, real.lm_train_fn, inputs, mode="aot")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jl.trace(model, real.lm_train_fn, inputs, mode="aot")  # exact: test_hf_models


def test_without_the_transformers_plugin_the_kv_cache_goes_unnamed():
    """The KV-cache warning is the plug-in's: without it the empty cache constants pass silently."""
    pytest.importorskip("transformers")
    from tests.fixtures import real

    f = real.get("hf_gpt2")

    def with_cache(m, **kw):
        return m(**kw, use_cache=True).loss

    def said():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            jl.trace(f.make_model(), with_cache, f.make_inputs(2))
        return [str(w.message) for w in caught if w.category is jl.errors.BakedConstantWarning]

    assert any("KV cache" in m and "use_cache=False" in m for m in said())
    with watch_table.unregistered("transformers"):
        assert not any("KV cache" in m for m in said())
