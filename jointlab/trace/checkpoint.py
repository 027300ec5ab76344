"""Gradient checkpointing under tracing: exact RNG replay, recompute marks, reentrant refusal.

Non-reentrant ``torch.utils.checkpoint`` saves the generator state in Python
(``torch.get_rng_state()``) when the checkpointed forward starts and sets it
back (``torch.set_rng_state``) around the recompute in backward, so the
recompute draws the same dropout masks. make_fx records tensor ops only: those
Python calls would run once, at trace time, on the real generator, and the
graph's recompute would draw fresh masks. While tracing, :func:`checkpoint_tracing`
turns them into graph nodes (:data:`GET_STATE`, :data:`SET_STATE`), so running
the graph replays the state exactly as eager does. It also records the nodes
created while checkpoint recomputes (:attr:`CheckpointSeen.recomputed`, handed
to the passes as ``TraceFacts.recomputed``: :mod:`jointlab.passes.recompute`
tags them, the annotation pass turns the tag into the ``recompute`` flag) and
refuses reentrant checkpointing, which cannot be traced (its backward calls
``backward()`` inside the engine). It writes no node meta.
"""

from __future__ import annotations

import contextlib
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.utils.checkpoint as torch_checkpoint

from jointlab.errors import CheckpointWarning, UnsupportedCheckpointError, user_stacklevel
from jointlab.patching import patched
from jointlab.runtime.custom_ops import GET_STATE, ORIGINAL_RNG, SET_STATE
from jointlab.sources import user_line
from jointlab.torch_compat import (
    checkpoint_internals,
    checkpoint_region_entry,
    get_proxy_mode,
)
from jointlab.trace.function_checks import checked_user_code


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
    setattr(set_rng_state, _RECORDS, True)
    return set_rng_state


_RECORDS = "_jointlab_records_rng_state"


def records_rng_state(fn: Callable[..., Any]) -> bool:
    """True when calling ``fn`` now puts a generator-state node into the graph.

    Args:
        fn: What ``torch.set_rng_state`` (or the CUDA one) is bound to.

    Returns:
        ``fn`` is :func:`checkpoint_tracing`'s replacement and a proxy mode traces.
    """
    return bool(getattr(fn, _RECORDS, False)) and get_proxy_mode() is not None


def _rng_patches() -> list[tuple[Any, str, Any]]:
    cpu_get = _traced_get(ORIGINAL_RNG["cpu_get"], False)
    cpu_set = _traced_set(ORIGINAL_RNG["cpu_set"], False)
    return [(torch, "get_rng_state", cpu_get), (torch, "set_rng_state", cpu_set),
            (torch.random, "get_rng_state", cpu_get), (torch.random, "set_rng_state", cpu_set),
            (torch.cuda, "get_rng_state", _traced_get(ORIGINAL_RNG["cuda_get"], True)),
            (torch.cuda, "set_rng_state", _traced_set(ORIGINAL_RNG["cuda_set"], True))]


@dataclass
class CheckpointSeen:
    """What :func:`checkpoint_tracing` saw while the trace ran.

    Attributes:
        regions: Non-reentrant checkpointed regions entered by the traced pass.
        recomputed: Every node the proxy graph gained while checkpoint recomputed
            a region, in graph order per recompute (some may be erased later).
    """

    regions: int = 0
    recomputed: list[fx.Node] = field(default_factory=list)


# -- recording the recompute -------------------------------------------------------
def _recording_recompute(original: Callable[..., Any], seen: CheckpointSeen
                         ) -> Callable[..., Any]:
    def run_recompute(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        mode = get_proxy_mode()
        if mode is None:
            with checked_user_code():  # the user's forward again: the trace-wide checks
                return original(fn, *args, **kwargs)
        graph = mode.tracer.graph
        last = next(iter(reversed(graph.nodes)), None)  # torch 2.11's reversed() is no iterator
        try:
            with checked_user_code():
                return original(fn, *args, **kwargs)
        finally:
            node = last.next if last is not None else next(iter(graph.nodes), None)
            while node is not None and node.op != "root":
                seen.recomputed.append(node)
                node = node.next
    return run_recompute


# -- refusing reentrant checkpointing ---------------------------------------------------
_UNKNOWN = "an unknown source line"


def _refusing_reentrant(original: Callable[..., Any]) -> Callable[..., Any]:
    def forward(*args: Any, **kwargs: Any) -> Any:
        line = user_line(traceback.extract_stack(), unknown=_UNKNOWN)
        raise UnsupportedCheckpointError(
            f"reentrant gradient checkpointing (use_reentrant=True) at {line} cannot be "
            "traced: its backward calls backward() inside the autograd engine, which a joint "
            "graph cannot record. Use use_reentrant=False: torch.utils.checkpoint.checkpoint("
            "fn, *args, use_reentrant=False), or for transformers models "
            "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs="
            '{"use_reentrant": False}).')
    return staticmethod(forward)


def _counting(original: Callable[..., Any], seen: CheckpointSeen) -> Callable[..., Any]:
    def generator(*args: Any, **kwargs: Any) -> Any:
        if get_proxy_mode() is not None:  # the traced pass, not AOT's metadata pass
            seen.regions += 1
        return original(*args, **kwargs)
    return generator


def _checkpoint_patches(seen: CheckpointSeen) -> list[tuple[Any, str, Any]]:
    run, func = checkpoint_internals()
    return [(torch_checkpoint, "_run_fn_with_dynamo_disabled", _recording_recompute(run, seen)),
            (func, "forward", _refusing_reentrant(func.__dict__["forward"]))]


@contextlib.contextmanager
def checkpoint_tracing(replay_rng: bool = True) -> Iterator[CheckpointSeen]:
    """While tracing: refuse reentrant checkpoints, record recompute nodes, trace the RNG state.

    Args:
        replay_rng: Turn ``torch.get_rng_state``/``set_rng_state`` (and the CUDA
            ones) into graph nodes while a proxy mode traces (make_fx mode).

    Yields:
        What ran (checkpointed regions entered, the nodes their recomputes
        created), filled in as the trace goes; every patch is undone on exit,
        whatever happens.
    """
    seen = CheckpointSeen()
    patches = _checkpoint_patches(seen) + (_rng_patches() if replay_rng else [])
    name = checkpoint_region_entry()  # else AOT mode would drop its CheckpointWarning
    patches.append((torch_checkpoint, name, _counting(getattr(torch_checkpoint, name), seen)))
    with patched(patches):
        yield seen


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
        stacklevel=user_stacklevel())
