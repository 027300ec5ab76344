"""Gradient checkpointing under tracing: exact RNG replay, recompute marks, reentrant refusal.

Non-reentrant ``torch.utils.checkpoint`` saves the generator state in Python
(``torch.get_rng_state()``) when the checkpointed forward starts and sets it
back (``torch.set_rng_state``) around the recompute in backward, so the
recompute draws the same dropout masks. make_fx records tensor ops only: those
Python calls would run once, at trace time, on the real generator, and the
graph's recompute would draw fresh masks. While tracing, :func:`checkpoint_tracing`
turns them into graph nodes (:data:`GET_STATE`, :data:`SET_STATE`), so running
the graph replays the state exactly as eager does. It also tags the nodes
created while checkpoint recomputes (``node.meta[RECOMPUTE_TAG]``; the
annotation pass turns that into the ``recompute`` flag) and refuses reentrant
checkpointing, which cannot be traced (its backward calls ``backward()``
inside the engine).
"""

from __future__ import annotations

import contextlib
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
import torch.utils.checkpoint as torch_checkpoint

from jointlab.errors import CheckpointWarning, UnsupportedCheckpointError
from jointlab.meta import RECOMPUTE_TAG
from jointlab.passes.annotate import frame_text, innermost_user_frame
from jointlab.torch_compat import (
    checkpoint_internals,
    checkpoint_region_entry,
    get_proxy_mode,
)

_STATE_BYTES = {"cpu": torch.get_rng_state().numel()}
_SEEDED = (torch.Tag.nondeterministic_seeded,)  # the Stepper runs these in its own stream


# -- the generator state as graph values ----------------------------------------
def _device_generator_state(device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        return _ORIGINAL["cpu_get"]()
    return _ORIGINAL["cuda_get"](device)


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
        _ORIGINAL["cpu_set"](state)
    else:
        _ORIGINAL["cuda_set"](state, device)


@_rng_set_state.register_fake
def _(state: torch.Tensor, *, device: torch.device) -> None:
    return None


GET_STATE = torch.ops.jointlab.rng_get_state.default
SET_STATE = torch.ops.jointlab.rng_set_state.default
torch.fx.node.has_side_effect(SET_STATE)  # never dead-code: it has no users
_ORIGINAL: dict[str, Callable[..., Any]] = {
    "cpu_get": torch.get_rng_state, "cpu_set": torch.set_rng_state,
    "cuda_get": torch.cuda.get_rng_state, "cuda_set": torch.cuda.set_rng_state,
}


def is_rng_state_op(node: fx.Node) -> bool:
    """True for a node that reads or sets the generator state (checkpoint's replay)."""
    return node.target in (GET_STATE, SET_STATE)


def _cuda_device(device: Any) -> torch.device:
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _traced_get(original: Callable[..., Any], cuda: bool) -> Callable[..., Any]:
    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        if get_proxy_mode() is None:
            return original(device) if cuda else original()
        return GET_STATE(device=_cuda_device(device) if cuda else torch.device("cpu"))
    return get_rng_state


def _traced_set(original: Callable[..., Any], cuda: bool) -> Callable[..., Any]:
    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        if get_proxy_mode() is None:
            return original(new_state, device) if cuda else original(new_state)
        SET_STATE(new_state, device=_cuda_device(device) if cuda else torch.device("cpu"))
        return None
    return set_rng_state


def _rng_patches() -> list[tuple[Any, str, Any]]:
    cpu_get = _traced_get(_ORIGINAL["cpu_get"], False)
    cpu_set = _traced_set(_ORIGINAL["cpu_set"], False)
    return [(torch, "get_rng_state", cpu_get), (torch, "set_rng_state", cpu_set),
            (torch.random, "get_rng_state", cpu_get), (torch.random, "set_rng_state", cpu_set),
            (torch.cuda, "get_rng_state", _traced_get(_ORIGINAL["cuda_get"], True)),
            (torch.cuda, "set_rng_state", _traced_set(_ORIGINAL["cuda_set"], True))]


# -- marking the recompute ---------------------------------------------------------
def _marking_recompute(original: Callable[..., Any]) -> Callable[..., Any]:
    def run_recompute(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        mode = get_proxy_mode()
        if mode is None:
            return original(fn, *args, **kwargs)
        graph = mode.tracer.graph
        last = next(iter(reversed(graph.nodes)), None)  # torch 2.11's reversed() is no iterator
        try:
            return original(fn, *args, **kwargs)
        finally:
            node = last.next if last is not None else next(iter(graph.nodes), None)
            while node is not None and node.op != "root":
                node.meta[RECOMPUTE_TAG] = True
                node = node.next
    return run_recompute


def is_recompute_traced(node: fx.Node) -> bool:
    """True when the node was created while checkpoint recomputed a forward region."""
    return bool(node.meta.get(RECOMPUTE_TAG))


# -- refusing reentrant checkpointing ---------------------------------------------------
def _user_line() -> str:
    frame = innermost_user_frame(traceback.extract_stack()[:-2])
    return frame_text(frame) if frame is not None else "an unknown source line"


def _refusing_reentrant(original: Callable[..., Any]) -> Callable[..., Any]:
    def forward(*args: Any, **kwargs: Any) -> Any:
        raise UnsupportedCheckpointError(
            f"reentrant gradient checkpointing (use_reentrant=True) at {_user_line()} cannot be "
            "traced: its backward calls backward() inside the autograd engine, which a joint "
            "graph cannot record. Use use_reentrant=False: torch.utils.checkpoint.checkpoint("
            "fn, *args, use_reentrant=False), or for transformers models "
            "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs="
            '{"use_reentrant": False}).')
    return staticmethod(forward)


def _counting(original: Callable[..., Any], uses: dict[str, int]) -> Callable[..., Any]:
    def generator(*args: Any, **kwargs: Any) -> Any:
        if get_proxy_mode() is not None:  # the traced pass, not AOT's metadata pass
            uses["non_reentrant"] = uses.get("non_reentrant", 0) + 1
        return original(*args, **kwargs)
    return generator


def _checkpoint_patches() -> list[tuple[Any, str, Any]]:
    run, func = checkpoint_internals()
    return [(torch_checkpoint, "_run_fn_with_dynamo_disabled", _marking_recompute(run)),
            (func, "forward", _refusing_reentrant(func.__dict__["forward"]))]


@contextlib.contextmanager
def checkpoint_tracing(replay_rng: bool = True) -> Iterator[dict[str, int]]:
    """While tracing: refuse reentrant checkpoints, tag recompute nodes, trace the RNG state.

    Args:
        replay_rng: Turn ``torch.get_rng_state``/``set_rng_state`` (and the CUDA
            ones) into graph nodes while a proxy mode traces (make_fx mode).

    Yields:
        Counts of what ran (``"non_reentrant"``: checkpointed regions entered);
        every patch is undone on exit, whatever happens.
    """
    uses: dict[str, int] = {}
    patches = _checkpoint_patches() + (_rng_patches() if replay_rng else [])
    name = checkpoint_region_entry()  # else AOT mode would drop its CheckpointWarning
    patches.append((torch_checkpoint, name, _counting(getattr(torch_checkpoint, name), uses)))
    saved = [(obj, name, obj.__dict__[name]) for obj, name, _ in patches]
    try:
        for obj, name, new in patches:
            setattr(obj, name, new)
        yield uses
    finally:
        for obj, name, old in reversed(saved):
            setattr(obj, name, old)


def warn_checkpoint_not_recomputed(regions: int) -> None:
    """Say that an AOT joint graph keeps what checkpointing would have recomputed.

    The AOT export differentiates the checkpointed regions directly: its joint
    graph has no recompute, so its saved activations and memory figures are
    those of training without checkpointing.
    """
    warnings.warn(CheckpointWarning(
        f"the model checkpoints {regions} region(s), but mode='aot' exports them without "
        "the recompute: the joint graph keeps their activations for backward, so "
        "joint.memory() and saved_for_backward describe training without checkpointing "
        "(gradients are still exact). Trace with mode='make_fx' to see the recompute."),
        stacklevel=4)
