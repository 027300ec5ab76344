"""``jointlab.trace``: check the call, dispatch to a tracing mode, run the passes.

The modes live in :mod:`jointlab.trace.make_fx` (default) and
:mod:`jointlab.trace.aot`; both return :class:`jointlab.core.GraphParts`
built from one :class:`jointlab.trace.request.TraceRequest`. After the mode,
:func:`trace` runs the graph passes once, in their declared order
(:func:`jointlab.passes.pipeline.run_passes`), then the read-only checks of
the finished graph (random-op refusals, the baked-constant check, lost
backward kernels), and builds the :class:`~jointlab.runtime.graph.RunnableGraph`
(``jl.trace``, in :mod:`jointlab.graph`, hands it to the user as a JointGraph).
The mode's trace runs inside every watch of
:data:`jointlab.trace.watch_table.WATCHES` (refusals, guards, swaps, records,
in table order). All of it runs under
:func:`~jointlab.runtime.gc_pause.no_full_collection`: no full garbage
collection while it runs; a giant trace runs the one held back as it returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch import nn

from jointlab.assumptions import Assumptions, hooks_fact
from jointlab.errors import TraceError
from jointlab.passes.pipeline import run_passes
from jointlab.runtime import gc_pause
from jointlab.runtime.graph import RunnableGraph
from jointlab.runtime.stack_room import with_stack_room
from jointlab.trace.fake_world import (
    refuse_dtensor_inputs,
    refuse_dtensor_state_on_old_torch,
    refuse_loss_parallel,
    refuse_unsupported_wrappers,
)
from jointlab.trace.lost_backward import refuse_lost_backward
from jointlab.trace.make_fx import trace_make_fx
from jointlab.trace.python_state import warn_baked_constants
from jointlab.trace.random_ops import (
    refuse_explicit_generators,
    refuse_layout_dependent_draws,
)
from jointlab.trace.read_guards import read_facts, warn_side_effects
from jointlab.trace.refusals import refuse_compiled
from jointlab.trace.request import TraceRequest
from jointlab.trace.watch_table import WatchCall, retargets, watching

MODES = ("make_fx", "aot")


def trace(
    model: nn.Module,
    train_fn: Callable[..., Any],
    inputs: dict[str, Any],
    *,
    mode: str = "make_fx",
    dynamic: bool = False,
    dynamic_arg_dims: dict[str, int | list[int]] | None = None,
) -> RunnableGraph:
    """Trace ``train_fn(model, **inputs)`` and its backward into one FX graph.

    Args:
        model: The model. It is never changed by tracing, even on failure.
        train_fn: Returns a scalar loss, or ``(loss, loss_dict)``.
        inputs: Keyword arguments for ``train_fn``; leaves are tensors, int,
            float, bool, str or None, nested in dicts, lists or tuples.
        mode: ``"make_fx"`` (default) or ``"aot"`` (AOT joint export with descriptors).
        dynamic: Make every dim of every tensor input symbolic.
        dynamic_arg_dims: Dotted input path to the dims to make symbolic,
            e.g. ``{"batch.input_ids": [0, -1]}``. Parameters stay static.

    Returns:
        The traced :class:`JointGraph`, annotated and analysed.

    Raises:
        ValueError: ``mode`` or ``dynamic`` is invalid.
        jointlab.errors.JointlabError: The inputs, the loss or the model cannot
            be traced; the message says why and where.
    """
    with gc_pause.no_full_collection():  # not a walk of the growing heap every few seconds
        joint = _trace(model, train_fn, inputs, mode, dynamic, dynamic_arg_dims)
    if len(joint.graph_module.graph.nodes) >= gc_pause.COLLECT_AT_NODES:  # due now, not at a view
        gc_pause.collect_held_back()
    return joint


def _trace(model: nn.Module, train_fn: Callable[..., Any], inputs: dict[str, Any], mode: str,
           dynamic: bool, dynamic_arg_dims: dict[str, int | list[int]] | None
           ) -> RunnableGraph:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not isinstance(dynamic, bool):
        raise TypeError(f"dynamic must be a bool, got {type(dynamic).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    refuse_compiled(model)
    refuse_unsupported_wrappers(model, mode, dynamic or bool(dynamic_arg_dims))
    refuse_loss_parallel(mode)
    refuse_dtensor_state_on_old_torch(model)
    if mode == "make_fx":  # AOT mode names subclass inputs itself (trace/aot.py)
        refuse_dtensor_inputs(inputs)
    # before any of jointlab's trace-time hooks and switches: the state the user set
    assumptions = Assumptions.record(model)
    with watching(WatchCall(model, train_fn, mode)) as seen:  # trace/watch_table.py
        req = TraceRequest.of(model, inputs, dynamic, dynamic_arg_dims)
        parts, seen_by_trace = _trace_mode(mode, model, train_fn, req)
    no_kernel, sdpa_calls = seen["lost backward"], seen["meta attention"]
    ranks_read, watched = seen["rank reads"], seen["python state"]
    facts = (*assumptions.facts, hooks_fact(model, watched.recorder.installed_hooks),
             *ranks_read, *read_facts(watched))
    assumptions = dataclasses.replace(assumptions, facts=facts)
    warn_side_effects(watched)
    parts = dataclasses.replace(parts, assumptions=assumptions)
    gm = parts.graph_module
    run_passes(gm, dataclasses.replace(seen_by_trace, retargets=retargets(),
                                       sdpa_calls=tuple(sdpa_calls)))
    refuse_explicit_generators(gm)
    if mode == "aot":
        refuse_layout_dependent_draws(gm)
    warn_baked_constants(gm, train_fn, model)
    # only the global settings this graph bakes are guarded (jointlab.global_state)
    parts = dataclasses.replace(parts, assumptions=parts.assumptions.relevant_to(gm))
    joint = RunnableGraph.from_parts(parts)
    refuse_lost_backward(joint, no_kernel)
    joint.train_fn = train_fn
    return joint


def _trace_mode(mode: str, model: nn.Module, train_fn: Callable[..., Any], req: TraceRequest
                ) -> Any:
    if mode == "aot":
        from jointlab.trace.aot import trace_aot

        return with_stack_room(trace_aot, model, train_fn, req)
    # in one chunk of CPython's frame stack: no mmap churn at a chunk boundary
    return with_stack_room(trace_make_fx, model, train_fn, req)


__all__ = ["trace", "TraceError"]
