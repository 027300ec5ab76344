"""What a graph assumes about Python state: recorded at trace time, checked on every use.

Each case first shows, against eager autograd, that the changed state really changes
the step (so running the old graph would be a silent wrong answer), then that every
entry point refuses it, and that putting the state back runs bit-exact again.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.errors import AssumptionError, FastPathError, TrainFnMisuseError
from tests.util import eager_step, traced_real

MODES = ["make_fx", "aot"]


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.3), nn.Linear(32, 16)).train()


def _mse(model, x, y):
    return F.mse_loss(model(x), y)


def _inputs():
    g = torch.Generator().manual_seed(1)
    return {"x": torch.randn(4, 16, generator=g), "y": torch.randn(4, 16, generator=g)}


def _entry_points(joint, model, inputs):
    """Every public way to execute a graph on a model."""
    return {
        "joint.run": lambda: joint.run(model, inputs),
        "jl.compare": lambda: jl.compare(joint, model, inputs, seed=0),
        "jl.Stepper": lambda: jl.Stepper(joint, model, inputs, seed=0, device="cpu").run(),
        "jl.record": lambda: jl.record(joint, model, inputs),
        "joint.memory": lambda: joint.memory(model, inputs),
    }


def _graph_equals_eager(joint, model, inputs, seed=5):
    torch.manual_seed(seed)
    got = joint.run(copy.deepcopy(model), inputs)
    want = eager_step(copy.deepcopy(model), _mse, inputs, seed)
    return torch.equal(got[0], want[0]) and all(torch.equal(got[1][k], want[1][k])
                                                 for k in want[1])


# -- the state changes that used to give silent wrong answers -------------------------
def _to_eval(m):
    m.eval()


def _freeze_first(m):
    m[0].weight.requires_grad_(False)


def _new_dropout_p(m):
    m[1].p = 0.5


CHANGES = {"eval": _to_eval, "requires_grad": _freeze_first, "dropout_p": _new_dropout_p}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("change", list(CHANGES))
def test_state_changed_after_tracing_is_refused_everywhere(change, mode):
    model, inputs = _mlp(), _inputs()
    joint = jl.trace(model, _mse, inputs, mode=mode)
    changed = copy.deepcopy(model)
    CHANGES[change](changed)
    # the change matters: eager's step after it is not the traced step
    torch.manual_seed(5)
    before = eager_step(copy.deepcopy(model), _mse, inputs, 5)
    after = eager_step(copy.deepcopy(changed), _mse, inputs, 5)
    assert not (torch.equal(before[0], after[0]) and before[1].keys() == after[1].keys())
    for where, call in _entry_points(joint, changed, inputs).items():
        with pytest.raises(AssumptionError) as err:
            call()
        assert "joint.guards" in str(err.value), where
    assert _graph_equals_eager(joint, model, inputs)  # the traced state still runs exactly


def test_refusal_names_what_changed_the_traced_value_and_the_value_now():
    model, inputs = _mlp(), _inputs()
    joint = jl.trace(model, _mse, inputs)
    model[1].p = 0.5
    with pytest.raises(AssumptionError, match=r"'1'\.p was 0\.3 when traced and is 0\.5 now"):
        joint.run(model, inputs)
    model[1].p = 0.3
    model.eval()
    with pytest.raises(AssumptionError, match=r"in training mode when traced.*model\.train\(\)"):
        joint.run(model, inputs)


def test_compiled_graph_checks_the_guards_too():
    model, inputs = _mlp(), _inputs()
    compiled = jl.trace(model, _mse, inputs).compile("eager")
    model.eval()
    with pytest.raises(AssumptionError):
        compiled.run(model, inputs)


def test_autocast_at_run_time_that_was_not_traced_is_refused():
    model, inputs = _mlp(), _inputs()
    joint = jl.trace(model, _mse, inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = eager_step(copy.deepcopy(model), _mse, inputs, 5)[0]
        with pytest.raises(AssumptionError, match=r"autocast\[cpu\] was False .* 'bfloat16'"):
            joint.run(model, inputs)
    plain = eager_step(copy.deepcopy(model), _mse, inputs, 5)[0]
    assert not torch.equal(cast, plain)  # autocast changes eager's step


# -- the guard table --------------------------------------------------------------------
@pytest.mark.parametrize("name", ["hf_gpt2", "resnet"])
def test_guard_table_lists_every_module_flag_and_parameter(name):
    f, model, inputs, joint = traced_real(name, "make_fx")
    g = joint.guards
    assert list(g.columns) == ["kind", "target", "attr", "traced", "checks", "source"]
    flags = g[g["kind"] == "training"]
    want = {(fqn or "<the model>"): m.training for fqn, m in model.named_modules()}
    assert dict(zip(flags["target"], flags["traced"])) == want
    rg = g[g["kind"] == "requires_grad"]
    assert dict(zip(rg["target"], rg["traced"])) == {
        n: p.requires_grad for n, p in model.named_parameters()}
    hp = g[g["kind"] == "read"]  # what forward read: every dropout p, norm eps, momentum
    for fqn, m in model.named_modules():
        for attr in ("p", "eps", "momentum"):
            if isinstance(getattr(m, attr, None), float):
                row = hp[(hp["target"] == (fqn or "<the model>")) & (hp["attr"] == attr)]
                assert row["traced"].tolist() == [getattr(m, attr)], (fqn, attr)
    # what no forward reads is not guarded: a Linear's sizes (Conv's padding_mode is read)
    never_read = {"in_features", "out_features"}
    assert not never_read & set(hp["attr"]), sorted(never_read & set(hp["attr"]))
    classes = g[g["kind"] == "class"]
    assert dict(zip(classes["target"], classes["traced"])) == {
        (fqn or "<the model>"): f"{type(m).__module__}.{type(m).__qualname__}"
        for fqn, m in model.named_modules()}
    assert "autocast[cpu]" in set(g["attr"])
    assert "traced under" in joint._repr_html_() and "joint.guards" in joint._repr_html_()
    ps = sorted({m.p for m in model.modules() if isinstance(m, nn.Dropout)})
    if ps:  # the card names the dropout probabilities the step read
        assert "dropout p=" + ", ".join(f"{p:g}" for p in ps) in joint._repr_html_()


def test_guard_table_holds_a_dynamic_traces_shape_guards():
    model, inputs = _mlp(), _inputs()
    joint = jl.trace(model, _mse, inputs, dynamic_arg_dims={"x": 0, "y": 0})
    shape = joint.guards[joint.guards["kind"] == "shape"]
    dims = shape[shape["attr"] == "dim 0"]
    assert dict(zip(dims["target"], dims["traced"])) == {"x": 4, "y": 4}
    assert len(set(dims["checks"])) == 1  # x and y share one size symbol (unified)
    assert f"{len(joint.guards):,} guards checked on every run" in joint._repr_html_()


def test_batch_norm_momentum_change_is_refused():
    f, model, inputs, joint = traced_real("resnet", "make_fx")
    m = copy.deepcopy(model)
    bn = next(mod for mod in m.modules() if isinstance(mod, nn.BatchNorm2d))
    bn.momentum = 0.5
    with pytest.raises(AssumptionError, match="momentum was 0.1 when traced and is 0.5"):
        joint.run(m, inputs)


def test_saved_graph_keeps_its_guards(tmp_path):
    model, inputs = _mlp(), _inputs()
    joint = jl.trace(model, _mse, inputs)
    joint.save(tmp_path / "g.jlg")
    loaded = jl.load(tmp_path / "g.jlg")
    assert loaded.guards.equals(joint.guards)
    model.eval()
    with pytest.raises(AssumptionError):
        loaded.run(model, inputs)


def test_archive_without_recorded_guards_says_so():
    from pathlib import Path

    loaded = jl.load(Path(__file__).parent / "fixtures" / "archive_v2_mlp.jlg")
    g = loaded.guards
    assert g["kind"].tolist()[-1] == "unknown" and "nothing" in g["checks"].tolist()[-1]
    assert "not recorded" in loaded._repr_html_()


# -- a seed call inside train_fn ----------------------------------------------------------
class _SeedsItself(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.tensor([0.0290, 0.4019, 0.2598]))

    def forward(self):
        torch.manual_seed(42)
        return torch.bernoulli(self.p)


def _seeded_fn(m):
    return (m() * torch.tensor([1.0, 2.0, 4.0])).sum()


@pytest.mark.parametrize("mode", MODES)
def test_seed_call_inside_train_fn_is_refused_with_its_line(mode):
    torch.manual_seed(0)
    state = torch.get_rng_state()
    with pytest.raises(TrainFnMisuseError, match=r"torch\.manual_seed\(\) at .*test_guards\.py"):
        jl.trace(_SeedsItself(), _seeded_fn, {}, mode=mode)
    assert torch.equal(torch.get_rng_state(), state)  # tracing did not reseed the user's RNG


def test_torchs_own_rng_calls_inside_train_fn_still_trace():
    model, inputs = _mlp(), _inputs()

    def fn(m, x, y):
        with torch.random.fork_rng():  # torch itself sets the state back: not the user's seed
            return _mse(m, x, y)

    joint = jl.trace(model, fn, inputs)
    torch.manual_seed(3)
    want = eager_step(copy.deepcopy(model), fn, inputs, 3)
    torch.manual_seed(3)
    assert torch.equal(joint.run(model, inputs)[0], want[0])


# -- the fused fast path ----------------------------------------------------------------
def _frozen_encoder():
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2,
                                enable_nested_tensor=True)
    return nn.ModuleDict({"enc": enc.requires_grad_(False), "head": nn.Linear(32, 10)}).eval()


def _encoder_fn(model, x, y, pad):
    out = model["head"](model["enc"](x, src_key_padding_mask=pad))
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def _encoder_inputs():
    g = torch.Generator().manual_seed(0)
    pad = torch.zeros(2, 16, dtype=torch.bool)
    pad[1, 13:] = True
    return {"x": torch.randn(2, 16, 32, generator=g),
            "y": torch.randint(0, 10, (2, 16), generator=g), "pad": pad}


@pytest.fixture
def fastpath_restored():
    before = torch.backends.mha.get_fastpath_enabled()
    yield
    torch.backends.mha.set_fastpath_enabled(before)


@pytest.mark.parametrize("mode", MODES)
def test_eval_encoder_fast_path_is_refused_at_trace_time(mode, fastpath_restored):
    model, inputs = _frozen_encoder(), _encoder_inputs()
    with pytest.raises(FastPathError, match=r"'enc\.layers\.0' \(TransformerEncoderLayer\)"):
        jl.trace(model, _encoder_fn, inputs, mode=mode)
    # the refusal is real: with the fast path off, eager computes another loss
    on = eager_step(copy.deepcopy(model), _encoder_fn, inputs, 0)[0]
    torch.backends.mha.set_fastpath_enabled(False)
    off = eager_step(copy.deepcopy(model), _encoder_fn, inputs, 0)[0]
    assert not torch.allclose(on, off, atol=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_encoder_traced_with_fast_path_off_is_exact_and_guarded(mode, fastpath_restored):
    model, inputs = _frozen_encoder(), _encoder_inputs()
    torch.backends.mha.set_fastpath_enabled(False)
    joint = jl.trace(model, _encoder_fn, inputs, mode=mode)
    assert jl.compare(joint, model, inputs, seed=0).ok
    torch.backends.mha.set_fastpath_enabled(True)
    with pytest.raises(AssumptionError, match="fused attention fast path was False"):
        joint.run(model, inputs)


def test_layer_out_of_its_fast_path_still_refuses_attentions_own():
    model, inputs = _frozen_encoder(), _encoder_inputs()
    for layer in model["enc"].layers:
        layer.linear1.weight.requires_grad_(True)
    with pytest.raises(FastPathError, match=r"'enc\.layers\.0\.self_attn' \(MultiheadAttention\)"):
        jl.trace(model, _encoder_fn, inputs)


def test_trainable_encoder_in_eval_mode_traces_exactly():
    """Attention weights that need grad turn eager's fast paths off: nothing to refuse.

    (Unfreezing only ``linear1`` is not enough: the layer leaves its fast path, but its
    frozen ``self_attn`` then takes MultiheadAttention's own, and is refused.)
    """
    model, inputs = _frozen_encoder(), _encoder_inputs()
    for layer in model["enc"].layers:
        layer.self_attn.in_proj_weight.requires_grad_(True)
    joint = jl.trace(model, _encoder_fn, inputs)
    assert jl.compare(joint, model, inputs, seed=0).ok
