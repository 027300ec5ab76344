"""Guards from what the trace read (issue 40): attributes, config fields, items, globals,
closures, classes and hooks; side effects reported and undone; no false alarms.

Every refusal case first shows, against eager autograd, that the change really changes
the step (so running the old graph would be a silent wrong answer), then that the graph
refuses it, and that putting the state back runs bit-exact again. Every former false
alarm runs and is bit-exact against eager under the changed state.
"""

from __future__ import annotations

import copy
import random
import types
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.errors import AssumptionError, SideEffectWarning, UnsupportedRandomOpError
from tests.util import assert_unchanged, deep_state, eager_step

MODES = ["make_fx", "aot"]
SCALE = 0.5  # a module global the models below read
FACTOR = 3.0  # a global read inside an autograd.Function


def _mse(model, x, y):
    return F.mse_loss(model(x), y)


def _inputs(d: int = 8):
    g = torch.Generator().manual_seed(1)
    return {"x": torch.randn(4, d, generator=g), "y": torch.randn(4, d, generator=g)}


def _same(a, b) -> bool:
    return torch.equal(a[0], b[0]) and all(torch.equal(a[1][k], b[1][k]) for k in b[1])


def _graph_step(joint, model, inputs, seed=5):
    torch.manual_seed(seed)
    return joint.run(model, inputs)


def _refused_then_exact(joint, model, inputs, change, undo, fn=_mse, match=None):
    """The change alters eager's step, the graph refuses it, and undoing it runs exact."""
    before = eager_step(copy.deepcopy(model), fn, inputs, 5)
    change(model)
    after = eager_step(copy.deepcopy(model), fn, inputs, 5)
    assert not _same(before, after), "the change must matter to eager for this test"
    with pytest.raises(AssumptionError, match=match):
        joint.run(model, inputs)
    with pytest.raises(AssumptionError, match=match):
        jl.Stepper(joint, model, inputs, seed=0, device="cpu")
    undo(model)
    assert _same(_graph_step(joint, model, inputs), eager_step(model, fn, inputs, 5))


# -- items, config objects, globals, closures ---------------------------------------------
class Scaled(nn.Module):
    """Reads a dict item, a config object's field and a module global."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.opts = {"scale": 2.0}
        self.cfg = _Cfg()

    def forward(self, x):
        return self.lin(x) * self.opts["scale"] * self.cfg.shift * SCALE


class _Cfg:
    def __init__(self):
        self.shift = 1.5
        self.unused = "never read"


def _scaled():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), Scaled())


@pytest.mark.parametrize("mode", MODES)
def test_a_dict_item_and_a_config_field_read_in_forward_are_guarded(mode):
    model, inputs = _scaled(), _inputs()
    joint = jl.trace(model, _mse, inputs, mode=mode)

    def set_item(m, v=3.0):
        m[1].opts["scale"] = v

    def set_field(m, v=2.5):
        m[1].cfg.shift = v

    _refused_then_exact(joint, model, inputs, set_item, lambda m: set_item(m, 2.0),
                        match=r"'1'\.opts was \{'scale': 2\.0\} when traced")
    _refused_then_exact(joint, model, inputs, set_field, lambda m: set_field(m, 1.5),
                        match=r"'1'\.cfg\.shift was 1\.5 when traced and is 2\.5 now")
    g = joint.guards
    assert "cfg.unused" not in set(g["attr"])  # never read: never guarded
    model[1].cfg.unused = "changed"  # so no false alarm either
    assert _same(_graph_step(joint, model, inputs), eager_step(model, _mse, inputs, 5))


def _set_global(name: str, value):
    """A change (or undo) for _refused_then_exact that rebinds this module's global."""
    return lambda m: globals().__setitem__(name, value)


@pytest.mark.parametrize("mode", MODES)
def test_a_module_global_read_in_forward_is_guarded(mode):
    model, inputs = _scaled(), _inputs()
    joint = jl.trace(model, _mse, inputs, mode=mode)
    try:
        _refused_then_exact(joint, model, inputs, _set_global("SCALE", 0.25),
                            _set_global("SCALE", 0.5),
                            match=r"tests\.test_read_guards globals: SCALE was 0\.5")
    finally:
        _set_global("SCALE", 0.5)(None)


def _closure_step():
    scale = 0.5
    crit = nn.SmoothL1Loss(beta=1.0)

    def train_fn(model, x, y):
        return crit(model(x) * scale, y)

    def set_scale(v):
        nonlocal scale
        scale = v

    return train_fn, set_scale, crit


@pytest.mark.parametrize("mode", MODES)
def test_train_fns_closure_and_a_loss_module_outside_the_model_are_guarded(mode):
    torch.manual_seed(0)
    model, inputs = nn.Sequential(nn.Linear(8, 8), nn.Tanh()), _inputs()
    fn, set_scale, crit = _closure_step()
    joint = jl.trace(model, fn, inputs, mode=mode)
    _refused_then_exact(joint, model, inputs, lambda m: set_scale(2.0),
                        lambda m: set_scale(0.5), fn=fn,
                        match=r"train_fn: scale was 0\.5 when traced and is 2\.0 now")

    def set_beta(m, v=0.1):
        crit.beta = v

    _refused_then_exact(joint, model, inputs, set_beta, lambda m: set_beta(m, 1.0), fn=fn,
                        match=r"'train_fn: crit'\.beta was 1\.0 when traced")


class _Times(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * FACTOR

    @staticmethod
    def backward(ctx, g):
        return g * FACTOR


class UsesFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return _Times.apply(self.lin(x))


@pytest.mark.parametrize("mode", MODES)
def test_a_global_read_inside_an_autograd_function_is_guarded(mode):
    torch.manual_seed(0)
    model, inputs = UsesFunction(), _inputs()
    joint = jl.trace(model, _mse, inputs, mode=mode)
    try:
        _refused_then_exact(joint, model, inputs, _set_global("FACTOR", 4.0),
                            _set_global("FACTOR", 3.0), match=r"FACTOR was 3\.0")
    finally:
        _set_global("FACTOR", 3.0)(None)


# -- classes and hooks ------------------------------------------------------------------
def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8), nn.ReLU())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("index,new", [(1, nn.Sigmoid), (3, nn.ReLU6)])
def test_a_module_swapped_for_another_class_is_refused_naming_the_swap(mode, index, new):
    model, inputs = _mlp(), _inputs()
    inputs["x"] = inputs["x"] * 30  # activations past ReLU6's cap, so the swap matters
    with torch.no_grad():
        model[2].weight.mul_(20)
    joint = jl.trace(model, _mse, inputs, mode=mode)
    old = model[index]

    def swap(m):
        m[index] = new()

    def back(m):
        m[index] = old

    _refused_then_exact(joint, model, inputs, swap, back,
                        match=rf"'{index}' was a torch\.nn\.modules\.activation\."
                              rf"{type(old).__name__} when traced and is a torch\.nn\.modules"
                              rf"\.activation\.{new.__name__} now \(the module was replaced\)")


@pytest.mark.parametrize("mode", MODES)
def test_module_hooks_added_or_removed_after_tracing_are_refused(mode):
    model, inputs = _mlp(), _inputs()
    doubled = model[0].register_forward_hook(_double)
    joint = jl.trace(model, _mse, inputs, mode=mode)  # traced with the hook: the graph has it
    assert _same(_graph_step(joint, model, inputs), eager_step(model, _mse, inputs, 5))
    _refused_then_exact(joint, model, inputs, lambda m: doubled.remove(),
                        lambda m: m[0].register_forward_hook(_double),
                        match=r"'0' forward hooks were \['_double \(test_read_guards\.py:\d+\)'\] "
                              r"when traced and are \[\] now")
    pre = []
    _refused_then_exact(
        joint, model, inputs,
        lambda m: pre.append(m[2].register_forward_pre_hook(lambda mod, a: (a[0] + 1,))),
        lambda m: pre.pop().remove(), match=r"'2' forward pre-hooks were \[\] when traced")


def _double(mod, i, o):
    return o * 2


# -- Python random, side effects, the model left as it was ------------------------------
class LayerDrop(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return x if random.random() < 0.5 else self.lin(x)


@pytest.mark.parametrize("mode", MODES)
def test_python_random_in_forward_is_refused(mode):
    torch.manual_seed(0)
    model, inputs = nn.Sequential(nn.Linear(8, 8), LayerDrop()), _inputs()
    before = deep_state(model)
    state = random.getstate()
    with pytest.raises(UnsupportedRandomOpError, match=r"drew from Python's random module"):
        jl.trace(model, _mse, inputs, mode=mode)
    assert random.getstate() == state
    assert_unchanged(before, model)


class Counting(nn.Module):
    """Bumps a counter and stashes its output on every call: side effects only."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.calls = 0
        self.stash: list = []
        self.nan = float("nan")

    def forward(self, x):
        self.calls += 1
        out = self.lin(x)
        self.stash.append(out.detach())
        return out if self.nan != self.nan else out * 2  # a NaN attribute, read


@pytest.mark.parametrize("mode", MODES)
def test_side_effects_are_warned_undone_and_never_refused(mode):
    torch.manual_seed(0)
    model, inputs = nn.Sequential(Counting(), nn.Tanh()), _inputs()
    with pytest.warns(SideEffectWarning) as caught:
        joint = jl.trace(model, _mse, inputs, mode=mode)
    msg = str(caught[0].message)
    assert "'0'.calls (0 -> " in msg and "test_read_guards.py:" in msg, msg
    assert "'0'.stash ([] -> [" in msg, msg
    assert model[0].calls == 0 and model[0].stash == []  # tracing left the model as it was
    for _ in range(2):  # eager bumps the counter each step: still no refusal
        eager = eager_step(model, _mse, inputs, 5)
        assert _same(_graph_step(joint, model, inputs), eager)
    assert model[0].calls == 2  # eager's two steps; the graph's runs did not count
    with pytest.warns(SideEffectWarning):
        jl.trace(model, _mse, inputs, mode=mode)  # retracing works too
    assert model[0].calls == 2


class SetsOnFirstCall(nn.Module):
    """Like Funnel's pooling_mult: forward sets an attribute, then reads it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.mult = None
        self.state = None

    def forward(self, x):
        if self.mult is None:
            self.mult = 2
        out = self.lin(x) * self.mult
        self.state = out.detach()  # left holding a fake tensor by a trace that did not undo
        return out


@pytest.mark.parametrize("mode", MODES)
def test_tracing_leaves_python_attributes_as_they_were_and_runs_the_same_model(mode):
    torch.manual_seed(0)
    model, inputs = SetsOnFirstCall(), _inputs()
    with pytest.warns(SideEffectWarning, match=r"'<the model>'\.mult \(None -> 2"):
        joint = jl.trace(model, _mse, inputs, mode=mode)
    assert model.mult is None and model.state is None
    fresh = copy.deepcopy(model)
    assert _same(_graph_step(joint, model, inputs), eager_step(fresh, _mse, inputs, 5))


# -- false alarms gone ------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_changes_the_step_never_sees_run_exact(mode):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.0), nn.Linear(16, 8))
    model[0].note = "a plain attribute forward never reads"
    inputs = _inputs()
    joint = jl.trace(model, _mse, inputs, mode=mode)
    model[0].note = "changed"
    model[1].inplace = True  # where relu writes, not what it computes
    model[2].p = 0  # an int zero is the float zero to dropout
    assert _same(_graph_step(joint, model, inputs), eager_step(model, _mse, inputs, 5))


def test_an_unwatchable_config_is_guarded_whole():
    torch.manual_seed(0)

    class UsesNamespace(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.ns = types.SimpleNamespace(scale=2.0)

        def forward(self, x):
            return self.lin(x) * self.ns.scale

    model, inputs = UsesNamespace(), _inputs()
    joint = jl.trace(model, _mse, inputs)

    def change(m, v=3.0):
        m.ns.scale = v

    _refused_then_exact(joint, model, inputs, change, lambda m: change(m, 2.0),
                        match=r"'<the model>'\.ns\.scale was 2\.0")


# -- HF config fields -------------------------------------------------------------------
def _falcon():
    pytest.importorskip("transformers")
    from tests.fixtures.view_models import tiny_falcon

    return tiny_falcon(hidden_dropout=0.1)


def _lm_loss(model, input_ids):
    return model(input_ids=input_ids, labels=input_ids, use_cache=False).loss


@pytest.mark.parametrize("mode", MODES)
def test_hf_config_field_read_in_forward_is_guarded(mode):
    model = _falcon()
    inputs = {"input_ids": torch.randint(0, 64, (2, 8), generator=torch.Generator()
                                         .manual_seed(0))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        joint = jl.trace(model, _lm_loss, inputs, mode=mode)

    def change(m, v=0.0):
        m.config.hidden_dropout = v

    _refused_then_exact(joint, model, inputs, change, lambda m: change(m, 0.1), fn=_lm_loss,
                        match=r"'<the model>'\.config\.hidden_dropout was 0\.1 when traced "
                              r"and is 0\.0 now \(read at modeling_falcon\.py:\d+\)")


# -- save and load ----------------------------------------------------------------------
def test_a_loaded_graph_checks_the_reads_it_can_and_says_which_it_cannot(tmp_path):
    torch.manual_seed(0)
    model, inputs = nn.Sequential(nn.Linear(8, 8), nn.Tanh()), _inputs()
    fn, set_scale, _ = _closure_step()
    joint = jl.trace(model, fn, inputs)
    model.add_module("2", nn.Dropout(0.0))
    del model._modules["2"]
    joint.save(tmp_path / "g.jl")
    loaded = jl.load(tmp_path / "g.jl")
    g = loaded.guards
    closure = g[(g["kind"] == "variable") & (g["attr"] == "scale")]
    assert closure["checks"].str.startswith("not checked").all() and len(closure) == 1
    crit = g[(g["kind"] == "read") & (g["target"] == "train_fn: crit")]
    assert len(crit) and crit["checks"].str.startswith("not checked").all()
    model[1] = nn.Sigmoid()
    with pytest.raises(AssumptionError, match=r"the module was replaced"):
        loaded.run(model, inputs)


# -- plain tensors baked as constants ---------------------------------------------------
class TensorAttr(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale_t = torch.tensor(2.0)  # neither a parameter nor a buffer
        self.table = torch.arange(100.0) / 100  # large: guarded by a digest

    def forward(self, x):
        return self.lin(x) * self.scale_t + self.table[:8]


SHIFT = torch.tensor(0.5)


def _shifted(model, x, y):
    return F.mse_loss(model(x) + SHIFT, y)


def test_plain_tensor_attributes_and_globals_are_guarded_by_value():
    torch.manual_seed(0)
    model, inputs = TensorAttr(), _inputs()
    with pytest.warns(jl.errors.BakedConstantWarning, match="guarded by value"):
        joint = jl.trace(model, _shifted, inputs)

    def set_attr(m, v=3.0):
        m.scale_t = torch.tensor(v)

    _refused_then_exact(joint, model, inputs, set_attr, lambda m: set_attr(m, 2.0), fn=_shifted,
                        match=r"'<the model>'\.scale_t was tensor float32\[\] \[2\.0\] when "
                              r"traced and is tensor float32\[\] \[3\.0\] now")

    original = model.table.clone()

    def bump_table(m):
        m.table[3] += 1e-3  # in place, the same object: only its values changed

    _refused_then_exact(joint, model, inputs, bump_table, lambda m: m.table.copy_(original),
                        fn=_shifted, match=r"'<the model>'\.table was tensor float32\[100\] sha1")

    try:
        _refused_then_exact(joint, model, inputs, _set_global("SHIFT", torch.tensor(1.5)),
                            _set_global("SHIFT", torch.tensor(0.5)), fn=_shifted,
                            match=r"SHIFT was tensor float32\[\] \[0\.5\]")
    finally:
        _set_global("SHIFT", torch.tensor(0.5))(None)


def test_aot_mode_names_a_plain_tensor_attribute_instead_of_torchs_words():
    torch.manual_seed(0)
    with pytest.raises(jl.errors.TraceError, match=r"neither a parameter, a buffer nor an "
                                                   r"input.*register_buffer"):
        jl.trace(TensorAttr(), _shifted, _inputs(), mode="aot")


# -- process-wide hooks and the advice for flipped flags --------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_a_process_wide_module_hook_added_after_tracing_is_refused(mode):
    from torch.nn.modules.module import register_module_forward_hook

    model, inputs = _mlp(), _inputs()
    joint = jl.trace(model, _mse, inputs, mode=mode)
    handles = []
    _refused_then_exact(
        joint, model, inputs,
        lambda m: handles.append(register_module_forward_hook(
            lambda mod, a, o: o * 2 if isinstance(mod, nn.Tanh) else None)),
        lambda m: handles.pop().remove(),
        match=r"'<every module>' forward hooks were \[\] when traced and are \['test_a_pro")


def test_flipped_flags_are_advised_per_module_and_per_direction():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Dropout(0.2), nn.Linear(8, 8))
    model.train()
    model[1].eval()  # a frozen BatchNorm in a training model
    inputs = _inputs()
    joint = jl.trace(model, _mse, inputs)
    model[1].train()  # switched back by a later model.train()
    with pytest.raises(AssumptionError, match=r"\(\.eval\(\) on '1'\)") as info:
        joint.run(model, inputs)
    assert "model.eval()" not in str(info.value)  # that would put the dropout in eval too
    model[1].eval()
    model[2].eval()
    model[1].train()  # both directions at once
    with pytest.raises(AssumptionError) as info:
        joint.run(model, inputs)
    msg = str(info.value)
    assert "'2' was in training mode" in msg and "'1' was in eval mode" in msg, msg
    assert ".train() on '2'" in msg and ".eval() on '1'" in msg, msg
    model.train()
    model[1].eval()
    assert _same(_graph_step(joint, model, inputs), eager_step(model, _mse, inputs, 5))


class LargeTable(nn.Module):
    """Reads one entry of a 300-entry list and a deeply nested option: both guarded."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scales = [1.0] * 300
        self.deep = {"a": {"b": {"c": {"d": [2.0]}}}}

    def forward(self, x):
        return self.lin(x) * self.scales[7] * self.deep["a"]["b"]["c"]["d"][0]


def test_large_and_deep_containers_are_guarded_by_a_digest():
    torch.manual_seed(0)
    model, inputs = LargeTable(), _inputs()
    joint = jl.trace(model, _mse, inputs)

    def set_scale(m, v=3.0):
        m.scales[7] = v

    _refused_then_exact(joint, model, inputs, set_scale, lambda m: set_scale(m, 1.0),
                        match=r"'<the model>'\.scales was \{'container': 'list', 'items': 300")

    def set_deep(m, v=5.0):
        m.deep["a"]["b"]["c"]["d"][0] = v

    _refused_then_exact(joint, model, inputs, set_deep, lambda m: set_deep(m, 2.0),
                        match=r"'<the model>'\.deep was \{'container': 'dict'")


class ListOfConfigs(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.cfgs = [_Cfg(), _Cfg()]
        self.by_name = {"head": _Cfg()}

    def forward(self, x):
        return self.lin(x) * self.cfgs[1].shift * self.by_name["head"].shift


@pytest.mark.parametrize("mode", MODES)
def test_objects_held_in_a_list_or_dict_are_watched(mode):
    torch.manual_seed(0)
    model, inputs = ListOfConfigs(), _inputs()
    joint = jl.trace(model, _mse, inputs, mode=mode)

    def set_item(m, v=2.5):
        m.cfgs[1].shift = v

    _refused_then_exact(joint, model, inputs, set_item, lambda m: set_item(m, 1.5),
                        match=r"'<the model>'\.cfgs\[1\]\.shift was 1\.5 when traced")

    def set_named(m, v=2.5):
        m.by_name["head"].shift = v

    _refused_then_exact(joint, model, inputs, set_named, lambda m: set_named(m, 1.5),
                        match=r"'<the model>'\.by_name\['head'\]\.shift was 1\.5")
    model.cfgs[0].shift = 9.0  # never read: no false alarm
    assert _same(_graph_step(joint, model, inputs), eager_step(model, _mse, inputs, 5))
