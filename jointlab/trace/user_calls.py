"""Refuse calls of chosen module functions in a block: the user's own calls, or every call.

Some Python calls inside ``train_fn`` act outside the ops a trace records (a
seed call, an in-place collective through the process group, ``torch.cond``):
the graph would silently lack them. Both helpers replace such functions while
a block runs and put the originals back when it exits, whatever happens:

- :func:`refuse_user_calls`: a call whose immediate caller is the user's code
  raises :class:`~jointlab.errors.TrainFnMisuseError` before anything changes;
  a call made by torch or jointlab itself passes through.
- :func:`refuse_calls`: every call is judged, whoever makes it (a library's
  helper that reseeds has the same effect as the user's own call); the judge
  sees the :class:`CallSite` (the function that made the call and the user's
  line that led to it) and returns the refusal, or None to let the call run.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from jointlab.errors import JointlabError, TrainFnMisuseError
from jointlab.patching import patched
from jointlab.sources import frame_text, innermost_user_frame, is_user_frame, user_caller

_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
__all__ = ["CallSite", "Judge", "Message", "call_site", "refuse_calls", "refuse_user_calls"]

#: Builds the refusal text from the module, the function's name and the user's line.
Message = Callable[[Any, str, str], str]


@dataclass(frozen=True)
class CallSite:
    """Who called a watched function, and from which of the user's lines.

    Attributes:
        function: The caller's qualified name (``torch.random.fork_rng``).
        line: ``file:line: code`` of the call itself.
        user_line: The call's own line when the user's code made it; else the
            innermost line of the user's own code (not torch, jointlab or an
            installed package) that led to it; ``"an unknown line"`` if none.
        by_user: The call itself is in the user's own code.
    """

    function: str
    line: str
    user_line: str
    by_user: bool


def _generated(path: str) -> bool:
    return path.startswith("<")  # FX's generated code, make_fx's wrapper, exec'd strings


def _library(path: str) -> bool:
    """An installed package's file: user code to :func:`is_user_frame`, yet not the user's own."""
    return any(d in path for d in _INSTALLED)


def _own_code(path: str) -> bool:
    return is_user_frame(path) and not _generated(path) and not _library(path)


def call_site(caller: FrameType) -> CallSite:
    """The :class:`CallSite` of a call made by the code running in ``caller``.

    Args:
        caller: The frame that called the watched function.

    Returns:
        The caller's name and line, and the user's line that led to it.
    """
    frames = traceback.extract_stack(caller)
    code = caller.f_code
    qualname = getattr(code, "co_qualname", code.co_name)  # Python 3.10: the bare name
    function = f"{caller.f_globals.get('__name__', '?')}.{qualname}"
    by_user = _own_code(frames[-1].filename)
    user = frames[-1] if by_user else (
        innermost_user_frame(frames, also_skip=lambda p: not _own_code(p))
        or innermost_user_frame(frames, also_skip=_generated))
    return CallSite(function, frame_text(frames[-1]),
                    frame_text(user) if user is not None else "an unknown line", by_user)


#: Judges a call from its module, name, call site, the function it would run and its
#: arguments: the refusal to raise (its class and text), or None to let the call run.
Judge = Callable[[Any, str, CallSite, Callable[..., Any], tuple, dict],
                 "tuple[type[JointlabError], str] | None"]


def _judged(module: Any, name: str, original: Callable[..., Any], judge: Judge
            ) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        refusal = judge(module, name, call_site(sys._getframe(1)), original, args, kwargs)
        if refusal is None:
            return original(*args, **kwargs)
        error, text = refusal
        raise error(text)

    return call


def _refusing(module: Any, name: str, original: Callable[..., Any],
              message: Message) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        frame = user_caller(2)
        if frame is None:
            return original(*args, **kwargs)
        raise TrainFnMisuseError(message(module, name, frame_text(frame)))

    return call


def _replaced(targets: Iterable[tuple[Any, str]],
              wrap: Callable[[Any, str, Callable[..., Any]], Callable[..., Any]]
              ) -> contextlib.AbstractContextManager[None]:
    return patched([(mod, name, wrap(mod, name, getattr(mod, name)))
                    for mod, name in targets if hasattr(mod, name)])


def refuse_user_calls(targets: Iterable[tuple[Any, str]], message: Message
                      ) -> contextlib.AbstractContextManager[None]:
    """Refuse the user's calls of ``module.name`` for each target, inside this block.

    Args:
        targets: ``(module, function name)`` pairs; names a module lacks are skipped.
        message: The refusal text for ``(module, name, "file:line: code")``.

    Returns:
        A context manager; the originals are back when its block exits.
    """
    return _replaced(targets, lambda mod, name, fn: _refusing(mod, name, fn, message))


def refuse_calls(targets: Iterable[tuple[Any, str]], judge: Judge
                 ) -> contextlib.AbstractContextManager[None]:
    """Judge every call of ``module.name`` for each target, whoever makes it, inside this block.

    Args:
        targets: ``(module, function name)`` pairs; names a module lacks are skipped.
        judge: Called with ``(module, name, call site, original, args, kwargs)``;
            returns ``(error class, text)`` to refuse the call before it runs, or
            None to run it.

    Returns:
        A context manager; the originals are back when its block exits.
    """
    return _replaced(targets, lambda mod, name, fn: _judged(mod, name, fn, judge))
