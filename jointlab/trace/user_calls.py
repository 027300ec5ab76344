"""Refuse calls that the user's own code makes to chosen module functions, in a block.

Some Python calls inside ``train_fn`` act outside the ops a trace records (a
seed call, an in-place collective through the process group): the graph
would silently lack them. :func:`refuse_user_calls` replaces such functions
while a block runs; a call whose immediate caller is the user's code raises
:class:`~jointlab.errors.TrainFnMisuseError` before anything changes, and a
call made by torch or jointlab itself passes through. The originals are put
back when the block exits, whatever happens.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from jointlab.errors import TrainFnMisuseError
from jointlab.passes.annotate import frame_text, is_user_frame

#: Builds the refusal text from the module, the function's name and the user's line.
Message = Callable[[Any, str, str], str]


def _user_caller() -> traceback.FrameSummary | None:
    """The frame that called the replaced function, if it is the user's code."""
    caller = traceback.extract_stack(sys._getframe(2), limit=1)
    return caller[-1] if caller and is_user_frame(caller[-1].filename) else None


def _refusing(module: Any, name: str, original: Callable[..., Any],
              message: Message) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        frame = _user_caller()
        if frame is None:
            return original(*args, **kwargs)
        raise TrainFnMisuseError(message(module, name, frame_text(frame)))

    return call


@contextlib.contextmanager
def refuse_user_calls(targets: Iterable[tuple[Any, str]], message: Message) -> Iterator[None]:
    """Refuse the user's calls of ``module.name`` for each target, inside this block.

    Args:
        targets: ``(module, function name)`` pairs; names a module lacks are skipped.
        message: The refusal text for ``(module, name, "file:line: code")``.

    Yields:
        Nothing; the originals are back when the block exits.
    """
    saved = [(mod, name, getattr(mod, name)) for mod, name in targets if hasattr(mod, name)]
    try:
        for mod, name, original in saved:
            setattr(mod, name, _refusing(mod, name, original, message))
        yield
    finally:
        for mod, name, original in reversed(saved):
            setattr(mod, name, original)
