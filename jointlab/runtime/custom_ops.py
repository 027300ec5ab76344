"""jointlab's own custom ops, which a traced graph may hold: registered before any graph runs.

Running or loading a graph must not import the tracer, so the ops the tracer
puts into graphs are defined here, in the runtime layer:

- ``jointlab::rng_get_state`` / ``jointlab::rng_set_state`` (:data:`GET_STATE`,
  :data:`SET_STATE`): gradient checkpointing's generator-state replay as graph
  nodes (:mod:`jointlab.trace.checkpoint` records them).
- ``jointlab::mkldnn_rnn_layer`` (:data:`MKLDNN_RNN_LAYER`): oneDNN's LSTM layer
  called with grad mode on, so it keeps the workspace its backward reads under
  ``no_grad`` (:mod:`jointlab.plugins.onednn_rnn` retargets nodes to it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

__all__ = ["GET_STATE", "MKLDNN_RNN_LAYER", "ORIGINAL_RNG", "SET_STATE", "is_rng_state_op"]

aten = torch.ops.aten
_Tensor4 = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


# -- the generator state as graph values ----------------------------------------
_STATE_BYTES = {"cpu": torch.get_rng_state().numel()}
_SEEDED = (torch.Tag.nondeterministic_seeded,)  # the Stepper runs these in its own stream


def _device_generator_state(device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        return ORIGINAL_RNG["cpu_get"]()
    return ORIGINAL_RNG["cuda_get"](device)


@torch.library.custom_op("jointlab::rng_get_state", mutates_args=(), tags=_SEEDED)
def _rng_get_state(*, device: torch.device) -> torch.Tensor:
    """The default generator's state on ``device``, as a uint8 tensor (a copy)."""
    return _device_generator_state(device).clone()


@_rng_get_state.register_fake
def _(*, device: torch.device) -> torch.Tensor:
    size = _STATE_BYTES.get(device.type)
    if size is None:
        size = _device_generator_state(device).numel()
    return torch.empty(size, dtype=torch.uint8)


@torch.library.custom_op("jointlab::rng_set_state", mutates_args=(), tags=_SEEDED)
def _rng_set_state(state: torch.Tensor, *, device: torch.device) -> None:
    """Set the default generator on ``device`` to ``state``."""
    if device.type == "cpu":
        ORIGINAL_RNG["cpu_set"](state)
    else:
        ORIGINAL_RNG["cuda_set"](state, device)


@_rng_set_state.register_fake
def _(state: torch.Tensor, *, device: torch.device) -> None:
    return None


GET_STATE = torch.ops.jointlab.rng_get_state.default
SET_STATE = torch.ops.jointlab.rng_set_state.default
torch.fx.node.has_side_effect(SET_STATE)  # never dead-code: it has no users
#: torch's own generator-state functions (the tracer patches them while checkpointing).
ORIGINAL_RNG: dict[str, Callable[..., Any]] = {
    "cpu_get": torch.get_rng_state, "cpu_set": torch.set_rng_state,
    "cuda_get": torch.cuda.get_rng_state, "cuda_set": torch.cuda.set_rng_state,
}


def is_rng_state_op(node: fx.Node) -> bool:
    """True for a node that reads or sets the generator state (checkpoint's replay)."""
    return node.target in (GET_STATE, SET_STATE)


# -- oneDNN's RNN layer with its workspace -------------------------------------
@torch.library.custom_op("jointlab::mkldnn_rnn_layer", mutates_args=())
def _mkldnn_rnn_layer(input: torch.Tensor, weight0: torch.Tensor, weight1: torch.Tensor,
                      weight2: torch.Tensor, weight3: torch.Tensor, hx_: torch.Tensor,
                      cx_: torch.Tensor, reverse: bool, batch_sizes: list[int], mode: int,
                      hidden_size: int, num_layers: int, has_biases: bool, bidirectional: bool,
                      batch_first: bool, train: bool) -> _Tensor4:
    """``aten.mkldnn_rnn_layer`` with grad mode on, so ``train=True`` yields the workspace."""
    with torch.enable_grad():  # autograd is below this kernel: nothing is recorded
        out = aten.mkldnn_rnn_layer.default(
            input, weight0, weight1, weight2, weight3, hx_, cx_, reverse, batch_sizes, mode,
            hidden_size, num_layers, has_biases, bidirectional, batch_first, train)
    return tuple(t.detach() for t in out)  # type: ignore[return-value]


@_mkldnn_rnn_layer.register_fake
def _(input, weight0, weight1, weight2, weight3, hx_, cx_, reverse, batch_sizes, mode,
      hidden_size, num_layers, has_biases, bidirectional, batch_first, train) -> _Tensor4:
    with torch.enable_grad():
        return aten.mkldnn_rnn_layer.default(
            input, weight0, weight1, weight2, weight3, hx_, cx_, reverse, batch_sizes, mode,
            hidden_size, num_layers, has_biases, bidirectional, batch_first, train)


#: The graph's form of ``aten.mkldnn_rnn_layer.default``: same arguments and outputs.
MKLDNN_RNN_LAYER = torch.ops.jointlab.mkldnn_rnn_layer.default
