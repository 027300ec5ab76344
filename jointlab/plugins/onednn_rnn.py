"""The oneDNN RNN plug-in: ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` traced as eager runs them.

Two things stood between a traced RNN and eager's numbers on CPU:

* **Python decompositions.** torch registers Python kernels for ``aten.lstm``,
  ``aten.gru``, ``aten.rnn_tanh`` and ``aten.rnn_relu`` that replace the C++
  composite under the Python dispatcher, i.e. in AOT export and in dynamic
  make_fx traces. They compute LSTM cells with ``mm``/``addmm`` instead of the
  oneDNN kernel eager uses (``mkldnn_rnn_layer``), and (torch 2.13,
  ``torch._decomp.decompositions._rnn_helper``) they drop the dropout between
  layers: ``nn.LSTM(..., num_layers=2, dropout=p)`` traced without dropout. While
  tracing, :func:`eager_rnn_kernels` hides them, so the C++ composite runs, as
  in eager, and its ops are recorded. The C++ composite reads concrete sizes,
  so an RNN layer whose input has symbolic sizes (a dynamic trace) is refused
  with :class:`~jointlab.errors.UnsupportedModuleError` naming the module.
* **oneDNN's workspace.** Eager's CPU LSTM calls ``aten.mkldnn_rnn_layer``, whose
  fourth output (the workspace its backward reads) is only produced when grad
  mode is on. A joint graph runs under ``torch.no_grad()`` (``joint.run``, the
  Stepper, ``jl.compare``), where the kernel returns no workspace and the
  backward node fails. The retarget pass (:func:`jointlab.passes.pipeline.retarget`)
  points those nodes at :data:`~jointlab.runtime.custom_ops.MKLDNN_RNN_LAYER`
  (defined in ``runtime/`` because a loaded graph needs it without the tracer),
  which calls the same kernel with grad mode on (and records nothing for
  autograd), so the graph produces what eager's forward produces under any grad mode.

The plug-in registers two rows of the watch table: "RNN kernels" (entered around
every trace: :func:`eager_rnn_kernels`) and "oneDNN workspace" (its ``retargets``
pair, applied by the retarget pass). ``with watch_table.unregistered("onednn rnn"):``
traces without both: plain models are unaffected; an LSTM's graph then keeps
``aten.mkldnn_rnn_layer`` and its backward fails under ``no_grad``.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from jointlab.errors import UnsupportedModuleError
from jointlab.runtime.custom_ops import MKLDNN_RNN_LAYER
from jointlab.sources import at_user_line
from jointlab.torch_compat import without_python_decompositions
from jointlab.trace.watch_table import Watch

__all__ = ["AFTER", "NAME", "RNN_OPS", "ROWS", "eager_rnn_kernels"]

aten = torch.ops.aten

#: RNN ops whose Python decompositions differ from eager's C++ composite.
RNN_OPS = (aten.lstm.input, aten.lstm.data, aten.gru.input, aten.gru.data,
           aten.rnn_tanh.input, aten.rnn_tanh.data, aten.rnn_relu.input, aten.rnn_relu.data)


def _symbolic(value: Any) -> bool:
    data = getattr(value, "data", value)  # a PackedSequence holds its tensor in .data
    return isinstance(data, torch.Tensor) and any(
        isinstance(d, torch.SymInt) for d in data.shape)


def _refuse_symbolic(name: str) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
        if not any(_symbolic(a) for a in args):
            return
        line = at_user_line(traceback.extract_stack(sys._getframe(1)))
        raise UnsupportedModuleError(
            f"{type(module).__name__} '{name}'{line} gets an input with symbolic (dynamic) "
            "sizes. Eager runs RNN layers through a C++ kernel that needs concrete sizes "
            "(oneDNN's LSTM on CPU), and torch's size-generic replacement computes other "
            "numbers (it drops the dropout between layers). Trace with static shapes "
            "(dynamic=False, or leave this input's dims out of dynamic_arg_dims); trace "
            "again for each new shape.")
    return hook


@contextlib.contextmanager
def eager_rnn_kernels(model: nn.Module) -> Iterator[None]:
    """Trace RNN ops through their C++ composite (eager's kernels), not torch's Python ones.

    Args:
        model: The traced model; its RNN modules refuse inputs with symbolic sizes.

    Yields:
        Nothing; inside the block the decompositions are hidden.

    Raises:
        UnsupportedModuleError: An RNN module got an input with symbolic sizes.
        UnsupportedTorchError: This torch keeps its Python kernels elsewhere.
    """
    with contextlib.ExitStack() as hooks:  # each hook handle removes itself on exit
        for name, mod in model.named_modules():
            if isinstance(mod, nn.RNNBase):
                hooks.enter_context(
                    mod.register_forward_pre_hook(_refuse_symbolic(name or "<the model>")))
        hooks.enter_context(without_python_decompositions(RNN_OPS))
        yield


NAME = "onednn rnn"
#: The table row the plug-in's rows follow.
AFTER = "random ops"
ROWS: tuple[Watch, ...] = (
    Watch("RNN kernels", "an RNN layer", "swap", UnsupportedModuleError,
          "traced through eager's own composite (oneDNN's LSTM layer as one op)",
          lambda c: eager_rnn_kernels(c.model)),
    Watch("oneDNN workspace", "oneDNN's LSTM layer (aten.mkldnn_rnn_layer) in the graph",
          "swap", None, "retargeted to jointlab::mkldnn_rnn_layer, the same kernel run in grad "
          "mode, so its backward has its workspace under no_grad (joint.run, Stepper, compare)",
          where="jointlab.passes.pipeline.retarget",
          retargets=((aten.mkldnn_rnn_layer.default, MKLDNN_RNN_LAYER),)),
)
