"""Torch's errors as jointlab errors, and where in the user's code they happened.

:func:`torch_errors` turns any non-jointlab exception escaping a public entry
point (``jl.trace``, ``joint.run``, ``jl.compare``...) into a jointlab error
naming the user's line and the graph node, with torch's error chained; an
exception the user's own code raised becomes a :class:`~jointlab.errors.TrainFnError`
that is also of the user's type. Running a graph needs it as much as tracing
does, so it lives in the runtime layer.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
import traceback
from collections.abc import Iterator

from jointlab import torch_compat
from jointlab.errors import JointlabError, TraceError, TrainFnError
from jointlab.sources import JOINTLAB_DIR, at_user_line, is_generated, is_user_frame, user_source

__all__ = ["caller_line", "torch_errors", "wrap_exception"]


# -- where in the user's code ---------------------------------------------------
def _is_user_file(path: str) -> bool:
    """A user source file: not torch, not jointlab's private modules, not FX's generated code."""
    return is_user_frame(path) and not is_generated(path)


def caller_line() -> str:
    """``" at file:line: code"`` for the innermost user frame of the current stack, or ``""``."""
    return at_user_line(traceback.extract_stack(sys._getframe(1)))


def _traceback_line(exc: BaseException) -> str:
    return at_user_line(traceback.extract_tb(exc.__traceback__))


# -- raw errors -------------------------------------------------------------------
_JOINTLAB_OWN = (TypeError, ValueError)  # jointlab's own argument checks raise these


def _innermost_file(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    return tb[-1].filename if tb else ""


def _is_users_own(exc: BaseException) -> bool:
    path = _innermost_file(exc)
    return bool(path) and _is_user_file(path)


def _is_jointlab_check(exc: BaseException) -> bool:
    path = _innermost_file(exc)
    return type(exc) in _JOINTLAB_OWN and path.startswith(JOINTLAB_DIR)


@functools.cache
def _train_fn_error_type(user_type: type[BaseException]) -> type[TrainFnError] | None:
    try:
        return type(f"TrainFnError[{user_type.__name__}]", (TrainFnError, user_type), {})
    except TypeError:  # incompatible layout (e.g. OSError): keep the user's exception
        return None


_TRACE_HINT = ("This is a torch error jointlab has no specific check for. Simplify the code "
               "at that line, or try the other tracing mode (mode='make_fx' or mode='aot')")


def _graph_line(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f.filename.startswith("<eval_with_key")]
    return f" at graph node: {frames[-1].line.strip()}" if frames and frames[-1].line else ""


def wrap_exception(exc: Exception, where: str, error: type[JointlabError] = TraceError,
                   hint: str = _TRACE_HINT) -> BaseException:
    """The jointlab error to raise for ``exc`` escaping ``where`` (e.g. ``"jl.trace"``).

    Args:
        exc: An exception that is not a jointlab error.
        where: The public entry point, for the message.
        error: The class for an error raised inside torch.
        hint: What to do about an error raised inside torch.

    Returns:
        The new exception (raise it ``from exc``), or ``exc`` itself when it
        is jointlab's own argument check or its type cannot be combined with
        :class:`~jointlab.errors.TrainFnError`.
    """
    if _is_jointlab_check(exc):
        return exc
    # No user frame in the traceback (torch raised inside jointlab's own call of it):
    # the line that called the public entry point.
    line = _traceback_line(exc) or caller_line()
    if _is_users_own(exc):
        cls = _train_fn_error_type(type(exc))
        if cls is None:
            return exc
        return cls(f"train_fn raised {type(exc).__name__}: {exc}{line} (during {where}). This "
                   "is your code's own exception, chained as __cause__; fix it there.")
    if torch_compat.is_real_tensor_in_fake_trace_error(exc):
        return error(f"{where} failed inside torch{line}: {_UNLIFTED_TENSOR} torch's error is "
                     "chained as __cause__.")
    no_derivative = _NO_DERIVATIVE.search(str(exc))
    if no_derivative:  # the backward failed: the op, not only the call of the entry point
        forward = getattr(exc, "jointlab_forward_source", "")
        return error(f"{where} failed in the backward (called{line}): torch has no "
                     f"derivative for {no_derivative.group(1)}, which the forward calls"
                     f"{' at ' + forward if forward else ''}, so there is no "
                     f"joint graph (eager's loss.backward() fails the same way). "
                     + _NO_DERIVATIVE_HINT + " torch's error is chained as __cause__.")
    return error(f"{where} failed inside torch{line}{_graph_line(exc)}: "
                 f"{type(exc).__name__}: {exc}\n{hint}; torch's error is chained as __cause__.")


def note_forward_source(exc: BaseException) -> None:
    """Remember on ``exc`` where the forward called the op a failed backward has no derivative for.

    Call it while make_fx still traces (the forward's nodes, with their stack traces,
    are in its graph): :func:`wrap_exception` then names that line.

    Args:
        exc: The error ``torch.autograd.grad`` raised.
    """
    hit = _NO_DERIVATIVE.search(str(exc))
    mode = torch_compat.get_proxy_mode() if hit else None
    graph = getattr(getattr(mode, "tracer", None), "graph", None)
    if hit is None or graph is None:
        return
    name = hit.group(1).split("::")[-1]
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and str(node.target).split(".")[-2:-1] == [name]:
            source = user_source(node.meta.get("stack_trace"))
            if source:
                exc.jointlab_forward_source = source  # type: ignore[attr-defined]
            return


#: torch's error when the backward reaches an op whose derivative it does not implement.
_NO_DERIVATIVE = re.compile(r"derivative for (\S+) is not implemented")
_NO_DERIVATIVE_HINT = (
    "Find where the forward calls it (a float8 matmul: torch._scaled_mm), and give it a "
    "backward: wrap the call in a torch.autograd.Function whose backward computes the "
    "gradient (as torchao's Float8Linear does), or detach its inputs where no gradient "
    "should flow through it.")


#: What jointlab says for torch's refusal of a real tensor in AOT's fake trace.
_UNLIFTED_TENSOR = (
    "the step uses a real tensor that is neither a parameter, a buffer nor an input (a "
    "plain tensor attribute of a module, or one captured from train_fn's closure or a "
    "global). mode='aot' cannot hold it. Register it on its module as a buffer "
    "(register_buffer(name, t, persistent=False)) or pass it to train_fn as an input; "
    "or trace with mode='make_fx', which bakes it into the graph as a constant and "
    "guards its value (joint.guards).")


@contextlib.contextmanager
def torch_errors(where: str, error: type[JointlabError] = TraceError,
                 hint: str = _TRACE_HINT) -> Iterator[None]:
    """Re-raise any non-jointlab exception as a jointlab error, the original chained.

    Also usable as a decorator.

    Args:
        where: The public entry point's name, e.g. ``"jl.trace"``.
        error: The class for an error raised inside torch.
        hint: What to do about an error raised inside torch.

    Yields:
        Nothing; exceptions escaping the block are translated.
    """
    try:
        yield
    except JointlabError:
        raise
    except ImportError as exc:  # a torch without a (private) module it imports on first use
        if not (exc.name or "").startswith("torch"):
            raise
        raise torch_compat.unsupported(f"{exc.name} (or a name in it)", f"run {where}") from exc
    except Exception as exc:
        new = wrap_exception(exc, where, error, hint)
        if new is exc:
            raise
        raise new from exc
