"""Torch's global settings: guarded where the graph bakes them, followed where it does not.

Every case is checked against eager autograd under the same setting: a refused
setting really changes eager's step while the graph would keep the traced one; a
setting that runs really gives eager's bits.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import jointlab as jl
from jointlab.errors import AssumptionError
from jointlab.global_state import SETTINGS, uses_default_dtype
from tests.util import eager_step

MODES = ["make_fx", "aot"]


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(32, 96), nn.Linear(32, 32)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 64, 3, 4, 8).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(att.transpose(1, 2).reshape(2, 64, 32))


class _Ones(nn.Module):
    """Creates a tensor with the default dtype in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) * torch.ones(8)


def _mse(model, x, y):
    out = model(x)
    return F.mse_loss(out[0] if isinstance(out, tuple) else out, y)


def _attention():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return _Attention(), {"x": torch.randn(2, 64, 32, generator=g),
                          "y": torch.randn(2, 64, 32, generator=g)}


def _mlp(cls=None):
    torch.manual_seed(0)
    model = cls() if cls else nn.Sequential(nn.Linear(8, 64), nn.GELU(), nn.Linear(64, 8),
                                            nn.LayerNorm(8))
    g = torch.Generator().manual_seed(1)
    return model, {"x": torch.randn(32, 8, generator=g), "y": torch.randn(32, 8, generator=g)}


def _lstm(cls=nn.LSTM):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return cls(16, 32, num_layers=2, batch_first=True), {
        "x": torch.randn(4, 10, 16, generator=g), "y": torch.randn(4, 10, 32, generator=g)}


def _same(got, want):
    """Loss and every gradient bitwise equal, dtypes included."""
    return all(g.dtype == w.dtype and torch.equal(g, w)
               for g, w in [(got[0], want[0])] + [(got[1][k], want[1][k]) for k in want[1]])


def _step(joint, model, inputs):
    return joint.run(copy.deepcopy(model), inputs)


def _eager(model, inputs):
    return eager_step(copy.deepcopy(model), _mse, inputs, 0)


def _guarded(joint):
    table = joint.guards
    return set(table[table.kind == "global"].attr)


@contextlib.contextmanager
def _setting(on, off):
    on()
    try:
        yield
    finally:
        off()


# -- item 8: baked and now guarded ----------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_sdpa_backend_change_is_refused(mode):
    model, inputs = _attention()
    joint = jl.trace(model, _mse, inputs, mode=mode)
    assert any("flash_attention" in str(n.target) for n in joint.graph_module.graph.nodes)
    assert _same(_step(joint, model, inputs), _eager(model, inputs))
    with sdpa_kernel(SDPBackend.MATH):
        math = _eager(model, inputs)
        with pytest.raises(AssumptionError, match=r"torch's sdpa flash was True when traced and "
                           r"is False now.*set it back to True.*or call jl\.trace again"):
            joint.run(model, inputs)
    assert not _same(math, _eager(model, inputs))  # the refusal is real: MATH changes eager


def test_sdpa_graph_traced_on_the_math_path_is_refused_on_the_flash_path():
    model, inputs = _attention()
    with sdpa_kernel(SDPBackend.MATH):
        joint = jl.trace(model, _mse, inputs)
        assert _same(_step(joint, model, inputs), _eager(model, inputs))
    with pytest.raises(AssumptionError, match="sdpa flash was False when traced"):
        joint.run(model, inputs)


def test_sdpa_rows_are_guarded_for_attention_only():
    model, inputs = _attention()
    assert {"sdpa flash", "sdpa math"} <= _guarded(jl.trace(model, _mse, inputs))
    # CPU's dispatcher reads only the flash and math flags
    assert not {"sdpa mem_efficient", "sdpa cudnn"} & _guarded(jl.trace(model, _mse, inputs))
    model, inputs = _mlp()
    assert not any(a.startswith("sdpa") for a in _guarded(jl.trace(model, _mse, inputs)))


def test_saved_attention_graph_keeps_its_sdpa_guard(tmp_path):
    model, inputs = _attention()
    jl.trace(model, _mse, inputs).save(tmp_path / "g.jlg")
    loaded = jl.load(tmp_path / "g.jlg")
    assert "sdpa flash" in _guarded(loaded)
    with sdpa_kernel(SDPBackend.MATH), pytest.raises(AssumptionError, match="sdpa flash"):
        loaded.run(model, inputs)


def test_mkldnn_off_is_refused_for_an_lstm():
    model, inputs = _lstm()
    joint = jl.trace(model, _mse, inputs)
    assert "mkldnn enabled" in _guarded(joint)
    with torch.backends.mkldnn.flags(enabled=False):
        off = _eager(model, inputs)
        with pytest.raises(AssumptionError, match="mkldnn enabled was True when traced"):
            joint.run(model, inputs)
    assert not _same(off, _eager(model, inputs))  # oneDNN's LSTM gives other bits


def test_gru_does_not_depend_on_mkldnn():
    model, inputs = _lstm(nn.GRU)
    joint = jl.trace(model, _mse, inputs)
    assert "mkldnn enabled" not in _guarded(joint)
    with torch.backends.mkldnn.flags(enabled=False):
        assert _same(_step(joint, model, inputs), _eager(model, inputs))


# -- former false alarms: followed at run time, exact ---------------------------------
FOLLOWED = {
    "deterministic algorithms": (lambda: torch.use_deterministic_algorithms(True),
                                 lambda: torch.use_deterministic_algorithms(False)),
    "float32 matmul precision": (lambda: torch.set_float32_matmul_precision("medium"),
                                 lambda: torch.set_float32_matmul_precision("highest")),
    "default dtype": (lambda: torch.set_default_dtype(torch.float64),
                      lambda: torch.set_default_dtype(torch.float32)),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(FOLLOWED))
def test_setting_the_graph_follows_runs_bit_exact(name, mode):
    model, inputs = _mlp()
    joint = jl.trace(model, _mse, inputs, mode=mode)
    assert name not in _guarded(joint)
    with _setting(*FOLLOWED[name]):
        assert _same(_step(joint, model, inputs), _eager(model, inputs))


def test_matmul_precision_medium_changes_eager_and_the_graph_follows():
    """Not a vacuous pass: 'medium' really changes eager's bits on CPU, and the run's too."""
    model, inputs = _mlp()
    joint = jl.trace(model, _mse, inputs)
    highest = _eager(model, inputs)
    with _setting(*FOLLOWED["float32 matmul precision"]):
        medium = _eager(model, inputs)
        assert _same(_step(joint, model, inputs), medium)
    assert not _same(medium, highest)


@pytest.mark.parametrize("mode", MODES)
def test_default_dtype_is_refused_where_the_model_creates_a_tensor(mode):
    model, inputs = _mlp(_Ones)
    joint = jl.trace(model, _mse, inputs, mode=mode)
    assert "default dtype" in _guarded(joint)
    with _setting(*FOLLOWED["default dtype"]):
        wide = _eager(model, inputs)
        with pytest.raises(AssumptionError, match=r"default dtype was 'float32' when traced "
                           r"and is 'float64' now.*torch\.set_default_dtype"):
            joint.run(model, inputs)
    assert wide[0].dtype == torch.float64  # eager's loss really changes


@pytest.mark.parametrize("make, wanted", [
    (lambda x: x * torch.ones(3), True),
    (lambda x: x + torch.arange(3) * 0.5, True),
    (lambda x: x + torch.tensor(1.5), True),
    (lambda x: x * torch.ones(3, dtype=torch.float32), False),
    (lambda x: x * 0.5 + x.new_ones(3), False),
    (lambda x: x + torch.arange(3), False),
])
def test_default_dtype_predicate(make, wanted):
    from jointlab.torch_compat import make_fx

    gm = make_fx(make)(torch.randn(3))
    assert uses_default_dtype(gm, "float32") is wanted


def test_every_setting_has_a_reader_predicate_and_doc():
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names))
    for s in SETTINGS:
        s.read()
        assert s.doc and s.how and callable(s.matters)
