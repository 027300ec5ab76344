"""torch 2.13's make_fx joint-tracing hooks, rebuilt from the pieces torch 2.11 and 2.12 have.

torch 2.13 added three small private APIs that jointlab's default trace mode
needs: ``torch.compiler._patch_engine_backward`` (tags each backward node with
``meta["autograd_backward"]`` and the ``seq_nr`` of the forward node it
differentiates), ``torch.compiler._non_strict_tracing_context`` (the flag the
patch asserts) and ``torch.fx.proxy._register_stack_trace_anchor`` (keeps the
frames of ``train_fn`` in make_fx stack traces). Colab ships torch 2.11, which
has everything they are made of: ``torch.autograd.graph._engine_run_backward``,
the ``torch.fx.traceback`` meta setters, ``torch.fx.proxy._COPY_META_FIELDS``
and ``TracerBase._filter_traceback_frames``. This module does what 2.13's
versions do with them, and only while jointlab traces: every patch is undone
when its context exits. :mod:`jointlab.torch_compat.graphs` uses torch's own
version where it exists and this one only before 2.13.

The same hooks serve ``mode="aot"``: 2.11's AOT export installs its own
(``setup_stacktrace_preservation_hooks``), which set the stack and ``seq_nr``
but not the ``autograd_backward`` mark 2.13's set. Without the mark no backward
node finds its forward twin, so every backward node (and every gradient
accumulation, whose module comes from its terms' twins) would take a
neighbour's module or ``<train_fn>``. :func:`patch_aot_backward_marks` puts
this module's hooks in their place while the export runs.
"""

from __future__ import annotations

import collections
import contextlib
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx.proxy as _proxy
import torch.fx.traceback as _fx_tb

from jointlab.patching import patched
from jointlab.torch_compat._base import required

_PURPOSE = "tag the backward nodes of a make_fx trace (torch 2.13's hooks, rebuilt)"
_ANCHORS: set[tuple[str, str]] = set()
_MARK = "autograd_backward"


def register_stack_trace_anchor(fn: Callable[..., Any]) -> None:
    """Keep the frames of ``fn`` in make_fx stack traces (``_register_stack_trace_anchor``)."""
    code = getattr(fn, "__code__", None)
    if code is not None:
        _ANCHORS.add((code.co_filename, code.co_name))


def _filter_traceback_frames(self: Any, user_stack_summary: traceback.StackSummary
                             ) -> traceback.StackSummary:
    # torch 2.13's TracerBase._filter_traceback_frames: 2.11's plus the anchors
    from torch.fx.experimental.symbolic_shapes import uninteresting_files

    user_frames: list[traceback.FrameSummary] = []
    if self._record_forward_stack_traces_only:
        user_frames = [f for f in user_stack_summary
                       if f.name == "forward" or f.filename.endswith("torch/__init__.py")
                       or (f.filename, f.name) in _ANCHORS]
    else:
        for i, frame in enumerate(user_stack_summary):
            if frame.name == "forward":
                user_frames = list(user_stack_summary)[i:]
                break
    skip = uninteresting_files()
    return traceback.StackSummary.from_list([f for f in user_frames if f.filename not in skip])


@contextlib.contextmanager
def non_strict_tracing_context() -> Iterator[None]:
    """While make_fx traces: stack traces keep the registered anchors' frames."""
    tracer = required(_proxy, "TracerBase", "torch.fx.proxy.TracerBase", _PURPOSE)
    required(tracer, "_filter_traceback_frames",
             "torch.fx.proxy.TracerBase._filter_traceback_frames", _PURPOSE)
    with patched([(tracer, "_filter_traceback_frames", _filter_traceback_frames)]):
        yield


def _backward_roots(outputs: Any) -> list[Any]:
    items = outputs if isinstance(outputs, (list, tuple)) else (outputs,)
    return [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]


def _install_hooks(roots: list[Any], state: dict[str, bool]) -> None:
    """torch 2.13's ``setup_stacktrace_preservation_hooks``: stack, seq_nr, backward mark."""
    meta = _fx_tb.get_current_meta

    def end_of_backward(saved: list[str]) -> Callable[[], None]:
        def callback() -> None:
            _fx_tb.set_stack_trace(saved)
            meta().pop(_MARK, None)
            state["callback_set"] = False
        return callback

    def prehook_for(stack: list[str], seq_nr: int) -> Callable[[Any], None]:
        def prehook(grad_output: Any) -> None:
            if not state["callback_set"]:
                torch.autograd.variable.Variable._execution_engine.queue_callback(
                    end_of_backward(_fx_tb.format_stack()))
                state["callback_set"] = True
            if stack:
                _fx_tb.set_stack_trace(stack)
            else:  # 2.11 records no forward traceback on the autograd node: drop the
                # previous node's gradient-accumulation stack (jointlab takes the
                # source from the forward twin)
                meta().pop("stack_trace", None)
            _fx_tb.set_grad_fn_seq_nr(seq_nr)
            meta()[_MARK] = True
        return prehook

    def posthook_for(stack: list[str]) -> Callable[[Any, Any], None]:
        def posthook(grad_input: Any, grad_output: Any) -> None:
            # the mark stays: what follows until the next prehook is gradient
            # accumulation (2.13 marks it through its special stack)
            _fx_tb.set_stack_trace(stack)
            _fx_tb.reset_grad_fn_seq_nr()
        return posthook

    seen: set[Any] = set()
    queue = collections.deque(r for r in roots if r is not None)
    seen.update(queue)
    while queue:
        node = queue.popleft()
        for fn, _ in node.next_functions:
            if fn is not None and fn not in seen:
                seen.add(fn)
                queue.append(fn)
        stack = node.metadata.get("traceback_", [])
        node.register_prehook(prehook_for(stack, node._sequence_nr()))
        node.register_hook(posthook_for([*stack, _fx_tb.GRADIENT_ACC_SPECIAL_STACK]))


@contextlib.contextmanager
def patch_engine_backward() -> Iterator[None]:
    """torch 2.13's ``torch.compiler._patch_engine_backward``, for torch 2.11 and 2.12."""
    graph = torch.autograd.graph
    original = required(graph, "_engine_run_backward",
                        "torch.autograd.graph._engine_run_backward", _PURPOSE)
    fields = required(_proxy, "_COPY_META_FIELDS", "torch.fx.proxy._COPY_META_FIELDS", _PURPOSE)
    for name in ("get_current_meta", "set_stack_trace", "set_grad_fn_seq_nr",
                 "reset_grad_fn_seq_nr", "format_stack", "GRADIENT_ACC_SPECIAL_STACK"):
        required(_fx_tb, name, f"torch.fx.traceback.{name}", _PURPOSE)
    state = {"callback_set": False}

    def run_backward(outputs: Any, *args: Any, **kwargs: Any) -> Any:
        _install_hooks(_backward_roots(outputs), state)
        try:
            return original(outputs, *args, **kwargs)
        finally:
            _fx_tb.get_current_meta().pop(_MARK, None)

    added = _MARK not in fields
    if added:
        fields.append(_MARK)
    try:
        with patched([(graph, "_engine_run_backward", run_backward),
                      (torch.autograd, "_engine_run_backward", run_backward)]):
            yield
    finally:
        if added:
            fields.remove(_MARK)


_AOT_CAPTURE = "torch._functorch._aot_autograd.graph_capture_wrappers"
_AOT_HOOKS = "setup_stacktrace_preservation_hooks"
_AOT_PURPOSE = "tag the backward nodes of a mode='aot' export (torch 2.13's hooks, rebuilt)"


@contextlib.contextmanager
def patch_aot_backward_marks() -> Iterator[None]:
    """While AOT exports: 2.13's backward hooks (with the ``autograd_backward`` mark).

    Replaces the AOT capture's ``setup_stacktrace_preservation_hooks`` with
    :func:`_install_hooks` (what 2.13's does: the forward stack and ``seq_nr``
    on each backward node, the mark from a node's prehook to the end of the
    gradient accumulation its posthook starts, whose special stack makes torch
    set ``is_gradient_acc``), and copies the mark into node meta.
    """
    from jointlab.torch_compat._base import torch_module

    capture = torch_module(_AOT_CAPTURE, _AOT_PURPOSE)
    required(capture, _AOT_HOOKS, f"{_AOT_CAPTURE}.{_AOT_HOOKS}", _AOT_PURPOSE)
    fields = required(_proxy, "_COPY_META_FIELDS", "torch.fx.proxy._COPY_META_FIELDS",
                      _AOT_PURPOSE)
    state = {"callback_set": False}

    def install(roots: list[Any]) -> None:
        _install_hooks([r for r in roots if r is not None], state)

    added = _MARK not in fields
    if added:
        fields.append(_MARK)
    try:
        with patched([(capture, _AOT_HOOKS, install)]):
            yield
    finally:
        _fx_tb.get_current_meta().pop(_MARK, None)
        if added:
            fields.remove(_MARK)
