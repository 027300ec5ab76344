"""One ``TorchFunctionMode`` over the user's code while it is traced: the function checks.

jl.trace watches a few torch functions in the traced step: the backward calls
and ``.grad`` accesses it refuses inside ``train_fn``
(:mod:`jointlab.trace.refusals`) and the SDPA calls on meta tensors it records
(:mod:`jointlab.trace.meta_attention`). Each is a handler registered for its
function; one :class:`FunctionChecks` mode finds a call's handler with one dict
lookup and passes every other call straight through.

A Python mode costs a call on every torch function it sees, ``Tensor``
attribute reads included, so the mode is active only where the user's code
runs: around each call of ``train_fn`` (:func:`checked_user_code`, entered by
:func:`~jointlab.trace.refusals.in_train_fn`) and around checkpoint's recompute
of a forward region in the backward (with the trace-wide handlers only, as
before). make_fx's own machinery, the rest of the backward and the passes run
without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch.overrides import TorchFunctionMode

__all__ = ["FunctionChecks", "Handler", "checked_user_code", "merge_handlers", "trace_handlers"]

#: Called with ``(func, args, kwargs)`` before ``func`` runs; raises to refuse the call.
Handler = Callable[[Any, tuple, dict], None]

# Handlers that hold for the whole trace (a stack: traces may nest).
_TRACE: list[dict[Any, Handler]] = []


class FunctionChecks(TorchFunctionMode):
    """Run the handler registered for a torch function, then the function."""

    def __init__(self, handlers: dict[Any, Handler]) -> None:
        super().__init__()
        self.handlers = handlers

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = self.handlers.get(func)
        if handler is not None:
            handler(func, args, kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def trace_handlers(handlers: dict[Any, Handler]) -> Iterator[None]:
    """Register ``handlers`` for every stretch of user code traced inside this block.

    Args:
        handlers: Function to handler.

    Yields:
        Nothing; the handlers are dropped on exit.
    """
    _TRACE.append(handlers)
    try:
        yield
    finally:
        _TRACE.remove(handlers)


def _both(first: Handler, second: Handler) -> Handler:
    """One handler that runs ``first`` then ``second`` (either may refuse the call)."""
    def run_both(func: Any, args: tuple, kwargs: dict) -> None:
        first(func, args, kwargs)
        second(func, args, kwargs)
    return run_both


def merge_handlers(*tables: dict[Any, Handler] | None) -> dict[Any, Handler]:
    """Merge handler tables; a function registered in several keeps every handler, in order.

    Args:
        *tables: Function-to-handler tables (None entries are skipped).

    Returns:
        One table: each function maps to a handler that runs all of its handlers.
    """
    merged: dict[Any, Handler] = {}
    for table in tables:
        for func, handler in (table or {}).items():
            merged[func] = _both(merged[func], handler) if func in merged else handler
    return merged


def _trace_wide() -> dict[Any, Handler]:
    return merge_handlers(*_TRACE)


@contextlib.contextmanager
def checked_user_code(handlers: dict[Any, Handler] | None = None) -> Iterator[None]:
    """Run the user's code under the trace-wide handlers and ``handlers``, in one mode.

    Args:
        handlers: Handlers for this stretch only (``train_fn``'s refusals).

    Yields:
        Nothing; no mode is pushed when there is nothing to check.
    """
    merged = merge_handlers(*_TRACE, handlers)
    if not merged:
        yield
        return
    with FunctionChecks(merged):
        yield
