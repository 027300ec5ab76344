"""Seed calls judged by their effect, whoever makes them; torch.cond refused in jointlab words.

Eager is the reference wherever a graph runs: a seed call inside the traced step
(the user's, a library helper's such as PyTorch's OpInfo ``wrapper_set_seed``,
torch's own ``fork_rng`` where the graph cannot record it, or one that bypasses
``torch.manual_seed``) is refused with the function that made it and the user's
line, and the user's generator is left as it was; ``fork_rng`` in make_fx mode,
which the graph records, runs bit for bit as eager. ``torch.cond`` on a tensor
predicate is refused in both modes with the line and the fix; on a Python bool it
traces the branch eager runs.
"""

from __future__ import annotations

import copy
import importlib
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

import jointlab as jl
from jointlab.errors import TrainFnMisuseError, UnsupportedControlFlowError
from tests.fixtures import opinfo_seed
from tests.util import eager_step

MODES = ("make_fx", "aot")


class _Drawing(nn.Module):
    """Draws from the default generator through ``draw(self)``, the case under test."""

    def __init__(self, draw):
        super().__init__()
        self.p = nn.Parameter(torch.linspace(0.05, 0.95, 64))
        self.draw = draw

    def forward(self):
        return self.draw(self)


def _loss(model):
    return (model() * torch.arange(1.0, 65.0)).sum()


def _refused(model, mode, error=TrainFnMisuseError):
    torch.manual_seed(0)
    state = torch.get_rng_state()
    with pytest.raises(error) as info:
        jl.trace(model, _loss, {}, mode=mode)
    assert torch.equal(torch.get_rng_state(), state)  # the user's generator untouched
    return str(info.value)


def _installed_copy(tmp_path, monkeypatch):
    """The OpInfo wrapper as an installed package's module (a ``site-packages`` folder)."""
    site = tmp_path / "site-packages"
    site.mkdir()
    shutil.copy(Path(opinfo_seed.__file__), site / "opinfo_lib.py")
    monkeypatch.syspath_prepend(str(site))
    return importlib.import_module("opinfo_lib")


# -- a library's seed call -------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_library_seed_call_is_refused_naming_it_and_the_users_line(mode, tmp_path, monkeypatch):
    lib = _installed_copy(tmp_path, monkeypatch)
    model = _Drawing(lambda m: lib.wrapper_set_seed(torch.bernoulli, m.p))  # the user's line
    msg = _refused(model, mode)
    assert "torch.manual_seed() through opinfo_lib.wrapper_set_seed (at " in msg
    assert "opinfo_lib.py:" in msg and "torch.manual_seed(42)" in msg
    assert "reached from your line " in msg and "test_seed_and_cond.py:" in msg
    assert "lib.wrapper_set_seed(torch.bernoulli, m.p)" in msg
    assert "Keep wrapper_set_seed out of train_fn" in msg and "seed=s" in msg


@pytest.mark.parametrize("mode", MODES)
def test_opinfo_wrapper_in_the_users_own_files_is_refused_with_its_line(mode):
    model = _Drawing(lambda m: opinfo_seed.wrapper_set_seed(torch.bernoulli, m.p))
    msg = _refused(model, mode)
    assert "train_fn calls torch.manual_seed() at " in msg
    assert "opinfo_seed.py:" in msg and "(in tests.fixtures.opinfo_seed.wrapper_set_seed)" in msg


@pytest.mark.parametrize("mode", MODES)
def test_a_seed_that_bypasses_torch_manual_seed_is_refused_by_its_effect(mode):
    def draw(m):
        torch.default_generator.manual_seed(7)  # no torch.manual_seed: the state changes
        return torch.bernoulli(m.p)

    msg = _refused(_Drawing(draw), mode)
    assert "default CPU generator was reseeded or had its state set" in msg
    assert "put back" in msg


# -- torch's own fork_rng: recorded in make_fx mode, refused in AOT mode ---------------------
def _forked(m):
    with torch.random.fork_rng():  # eager: the draw inside does not advance the stream
        inside = torch.bernoulli(m.p)
    return inside + 2 * torch.bernoulli(m.p)


def test_fork_rng_in_make_fx_replays_the_state_bit_for_bit():
    model = _Drawing(_forked)
    joint = jl.trace(model, _loss, {})
    torch.manual_seed(3)
    loss, grads, _ = joint.run(model, {})
    want_loss, want_grads, _ = eager_step(copy.deepcopy(model), _loss, {}, 3)
    assert torch.equal(loss, want_loss)
    assert torch.equal(grads["p"], want_grads["p"])
    # the reference is sensitive: without the restore the second draw differs
    torch.manual_seed(3)
    plain = (torch.bernoulli(model.p) + 2 * torch.bernoulli(model.p)) @ torch.arange(1.0, 65.0)
    assert not torch.equal(plain.detach(), want_loss)


def test_fork_rng_in_aot_mode_is_refused_naming_torch_and_the_users_line():
    msg = _refused(_Drawing(_forked), "aot")
    assert "torch.set_rng_state() through torch.random.fork_rng (at " in msg
    assert "reached from your line " in msg and "with torch.random.fork_rng()" in msg
    assert "mode='make_fx' records torch.set_rng_state" in msg


def test_a_seed_inside_fork_rng_is_refused_once_not_for_the_restore():
    def draw(m):
        with torch.random.fork_rng():
            torch.manual_seed(1)
            return torch.bernoulli(m.p)

    msg = _refused(_Drawing(draw), "aot")
    assert msg.startswith("train_fn calls torch.manual_seed() at ") and "set_rng_state" not in msg


# -- torch.cond ----------------------------------------------------------------------
class _Branching(nn.Module):
    def __init__(self, python_pred=None):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.python_pred = python_pred

    def forward(self, x):
        h = self.lin(x)
        pred = h.sum() > 0 if self.python_pred is None else self.python_pred
        return torch.cond(pred, lambda t: t.sin(), lambda t: t.cos() * 2, (h,))


def _branch_loss(model, x):
    return model(x).square().mean()


@pytest.mark.parametrize("mode", MODES)
def test_torch_cond_on_a_tensor_is_refused_with_the_line_and_the_fix(mode):
    torch.manual_seed(0)
    model, x = _Branching(), torch.randn(4, 8)
    with pytest.raises(UnsupportedControlFlowError) as info:
        jl.trace(model, _branch_loss, {"x": x}, mode=mode)
    msg = str(info.value)
    assert "train_fn calls torch.cond() at " in msg and "test_seed_and_cond.py:" in msg
    assert "return torch.cond(pred, lambda t: t.sin()" in msg
    assert "higher-order control flow" in msg
    assert "torch.where(pred, true_fn(x), false_fn(x))" in msg and "`if use_a:`" in msg
    assert "no rule registered" not in msg and "HigherOrderOperator" not in msg


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pred", [True, False])
def test_torch_cond_on_a_python_bool_traces_the_branch_eager_runs(mode, pred):
    torch.manual_seed(0)
    model, inputs = _Branching(python_pred=pred), {"x": torch.randn(4, 8)}
    joint = jl.trace(model, _branch_loss, inputs, mode=mode)
    loss, grads, _ = joint.run(model, inputs)
    want_loss, want_grads, _ = eager_step(copy.deepcopy(model), _branch_loss, inputs, 0)
    assert torch.equal(loss, want_loss)
    assert all(torch.equal(grads[n], want_grads[n]) for n in want_grads)
