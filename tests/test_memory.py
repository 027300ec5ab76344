"""Predicted memory of a joint step against the profiler's allocation events."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import jointlab as jl
from jointlab.analysis.memory.measure import measure_graph
from jointlab.analysis.memory.predict import CATEGORIES, predict
from jointlab.passes.analyze import ensure_analyzed
from jointlab.units import human_bytes
from tests.fixtures import zoo
from tests.util import traced_zoo


@pytest.fixture(scope="module")
def traced():
    """(joint, model, inputs) of a zoo fixture, from the session's one trace cache."""
    def get(name):
        _, model, inputs, joint = traced_zoo(name)
        return joint, model, inputs

    return get


@pytest.mark.parametrize("name", sorted(zoo.FIXTURES))
def test_peak_within_one_percent_of_profiler(traced, name):
    joint, model, inputs = traced(name)
    prof = joint.memory(model, inputs)
    assert prof.measured
    assert abs(prof.peak_bytes - prof.measured_peak_bytes) <= 0.01 * prof.measured_peak_bytes
    assert abs(prof.peak_error) <= 0.01
    # not just the peak: every step's live bytes agree within 1% of the peak
    tl = prof.timeline
    assert (tl["total"] - tl["measured"]).abs().max() <= 0.01 * prof.measured_peak_bytes


def test_state_and_inputs_count_from_the_start(traced):
    joint, model, inputs = traced("cnn_bn")
    prof = joint.memory()
    first = prof.timeline.iloc[0]
    params = sum(p.nbytes for p in model.parameters())
    buffers = sum(b.nbytes for b in model.buffers())
    ins = sum(t.nbytes for t in inputs.values())
    assert first["param"] == params and first["buffer"] == buffers and first["input"] == ins
    assert prof.peak_bytes > params + buffers + ins


def test_gradients_live_to_the_end_with_eager_sizes(traced):
    joint, model, inputs = traced("mlp")
    prof = joint.memory()
    last = prof.timeline.iloc[-1]
    assert last["gradient"] == sum(p.nbytes for p in model.parameters())
    assert last["activation"] == 0 and last["temporary"] == 0


def test_activations_are_forward_values_read_by_backward(traced):
    joint, _, _ = traced("tiny_lm")
    prof = joint.memory()
    life = prof.lifetimes.set_index("storage")
    acts = life[life.category == "activation"]
    assert len(acts) > 0
    assert (acts.phase == "forward").all()
    assert (acts.last_step >= prof.boundary_step).all()
    temps = life[(life.category == "temporary") & (life.phase == "forward")]
    assert (temps.last_step < prof.boundary_step).all()


def test_forward_and_backward_peaks(traced):
    joint, _, _ = traced("gpt2_small")
    prof = joint.memory()
    tl = prof.timeline
    assert max(prof.forward_peak_bytes, prof.backward_peak_bytes) == prof.peak_bytes
    assert tl.loc[:prof.boundary_step - 1, "phase"].ne("backward").all()
    assert tl.loc[prof.boundary_step, "phase"] == "backward"
    assert tl["node"].iloc[tl["total"].argmax()] == prof.peak_node
    assert set(CATEGORIES) <= set(tl.columns)
    assert (tl[list(CATEGORIES)].sum(axis=1) == tl["total"]).all()


def _measure_fn(fn, *args):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    ensure_analyzed(gm)  # predict only reads: run the analysis pass on this bare graph
    return predict(gm), measure_graph(gm, list(args))


def test_views_keep_their_base_alive():
    def f(x):
        y = x.sin()           # 4 KiB
        v = y.view(-1)[:4]    # a small view of y
        z = x.cos()           # y must still be live here through v
        return z + v.sum()

    pred, meas = _measure_fn(f, torch.randn(32, 32))
    assert pred.peak_bytes == int(meas["measured"].max())
    life = pred.lifetimes.set_index("storage")
    assert life.loc["sin", "aliases"] >= 3


def test_inplace_extends_lifetime_without_allocating():
    def f(x):
        a = x.mul(2)
        a.add_(1)
        b = x.exp()
        a.mul_(b)
        return a.sum()

    pred, meas = _measure_fn(f, torch.randn(64, 64))
    assert pred.peak_bytes == int(meas["measured"].max())
    assert (pred.timeline["total"] == meas["measured"]).all()


def test_multi_output_frees_each_output_on_its_own():
    def f(x, w, b):
        out, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, 1e-5)
        return out.relu() * 2, rstd.sum()

    args = (torch.randn(16, 64), torch.randn(64), torch.randn(64))
    pred, meas = _measure_fn(f, *args)
    assert (pred.timeline["total"] == meas["measured"]).all()


def test_unused_values_are_dropped_at_once():
    def f(x):
        x.exp()  # unused: freed right after it runs
        return x.sin()

    pred, meas = _measure_fn(f, torch.randn(128, 128))
    assert (pred.timeline["total"] == meas["measured"]).all()
    assert pred.peak_bytes == 2 * 128 * 128 * 4


def test_measuring_leaves_model_and_rng_untouched(traced):
    joint, model, inputs = traced("cnn_bn")
    bufs = {k: b.clone() for k, b in model.named_buffers()}
    torch.manual_seed(3)
    rng = torch.get_rng_state()
    joint.memory(model, inputs)
    assert torch.equal(rng, torch.get_rng_state())
    for k, b in model.named_buffers():
        assert torch.equal(b, bufs[k]), k


def test_model_without_inputs_is_an_error(traced):
    joint, model, inputs = traced("mlp")
    with pytest.raises(jl.errors.MemoryQueryError, match="model= was given without inputs=.*both"):
        joint.memory(model)
    with pytest.raises(jl.errors.JointlabError, match="inputs= was given without model="):
        joint.memory(inputs=inputs)
    assert issubclass(jl.errors.MemoryQueryError, ValueError)


def test_repr_is_one_short_line_of_the_headline_numbers(traced):
    joint, model, inputs = traced("mlp")
    prof = joint.memory(model, inputs)
    text = repr(prof)
    assert "\n" not in text and len(text) < 200, text
    assert human_bytes(prof.peak_bytes) in text and f"{len(joint.graph.nodes)} nodes" in text
    life = prof.lifetimes
    saved = int(life.loc[life["category"] == "activation", "bytes"].sum())
    assert saved > 0 and f"saved {human_bytes(saved)}" in text
    assert f"measured peak {human_bytes(prof.measured_peak_bytes)}" in text


def test_html_card_escapes_names(traced):
    joint, model, inputs = traced("mlp")
    prof = joint.memory(model, inputs)
    prof = dataclasses.replace(prof, name="<script>alert(1)</script>")
    out = prof._repr_html_()
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert "measured" in out and prof.peak_node in out


def test_cuda_rounding_applies_to_every_block(traced):
    joint, _, _ = traced("mlp")
    cpu, cuda = predict(joint), predict(joint, device="cuda")
    assert (cuda.lifetimes["bytes"] % 512 == 0).all()
    assert cuda.peak_bytes >= cpu.peak_bytes
