"""The user's source line: which frame is the user's, and how to name it.

The one walk from a stack to the user's own line (:func:`innermost_user_frame`
over a traceback's frames, :func:`walk_out` over live frames) and the one way
to write it: ``model.py:9``, or ``cell [3], line 9`` in a notebook. Every
layer above asks here; nothing here imports torch (its directory is found
without loading it), so the base layer stays light.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
import sysconfig
import traceback
from collections.abc import Callable, Sequence
from types import FrameType

__all__ = ["JOINTLAB_DIR", "at_user_line", "frame_text", "innermost_user_frame", "is_generated",
           "is_user_frame", "notebook_cell", "source_location", "stack_trace_frames",
           "user_caller", "user_line", "user_source", "walk_out"]

#: The jointlab package directory.
JOINTLAB_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: jointlab modules that hold user-level code (the demo models and their train_fn).
_USER_MODULES = (os.path.join(JOINTLAB_DIR, "models.py"),)
#: Python's own library (contextlib, functools, ...): never the user's line.
_STDLIB_DIRS = tuple({os.path.join(sysconfig.get_paths()[k], "") for k in ("stdlib", "platstdlib")})
_THIRD_PARTY = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


@functools.cache
def _torch_dir() -> str:
    spec = importlib.util.find_spec("torch")  # finds the package without importing it
    origin = spec.origin if spec is not None else None
    return os.path.dirname(origin) + os.sep if origin else "\0"


# -- which frame is the user's -------------------------------------------------------
def is_user_frame(path: str) -> bool:
    """True for a source file outside torch, Python's standard library and jointlab's machinery.

    jointlab's demo models (``jointlab/models.py``) count as user code.

    Args:
        path: A frame's file name.

    Returns:
        Whether a line of that file can be the user's.
    """
    if path.startswith(_torch_dir()):
        return False
    if path.startswith(_STDLIB_DIRS) and not any(d in path for d in _THIRD_PARTY):
        return False
    return not path.startswith(JOINTLAB_DIR) or path in _USER_MODULES


def is_generated(path: str) -> bool:
    """True for FX's generated graph code and make_fx's wrapper of the traced function."""
    return path.startswith("<eval_with_key") or path == "<string>"


def innermost_user_frame(frames: Sequence[traceback.FrameSummary],
                         also_skip: Callable[[str], bool] | None = None
                         ) -> traceback.FrameSummary | None:
    """The innermost frame of the user's own code, or None: the one walk over a stack.

    Args:
        frames: Frames outermost first (``traceback.extract_tb`` / ``extract_stack``).
        also_skip: Files that do not count as the user's either (e.g. transformers).

    Returns:
        The last frame for which :func:`is_user_frame` holds and ``also_skip`` does not.
    """
    for f in reversed(frames):
        if is_user_frame(f.filename) and not (also_skip and also_skip(f.filename)):
            return f
    return None


def walk_out(frame: FrameType | None, stop: Callable[[str], bool] = is_user_frame
             ) -> tuple[FrameType | None, int]:
    """Walk live frames outwards (``f_back``) to the first whose file ``stop`` accepts.

    The cheap form of :func:`innermost_user_frame` for code that runs on every torch
    call: no source line is read.

    Args:
        frame: Where to start (``sys._getframe(1)``: the caller).
        stop: Accepts the file name of the frame to stop at.

    Returns:
        That frame (None when no frame is accepted) and how many frames lie
        above ``frame`` on the way (0 when ``frame`` itself is accepted).
    """
    depth = 0
    while frame is not None and not stop(frame.f_code.co_filename):
        frame, depth = frame.f_back, depth + 1
    return frame, depth


def user_caller(depth: int = 2) -> traceback.FrameSummary | None:
    """The frame ``depth`` levels above the caller's, when it is the user's code.

    A replaced function asks with ``depth=2``: who called it (its own frame is 1).
    """
    caller = traceback.extract_stack(sys._getframe(depth), limit=1)
    return caller[-1] if caller and is_user_frame(caller[-1].filename) else None


def stack_trace_frames(stack_trace: str | None) -> list[traceback.FrameSummary]:
    """The frames of a stack trace's text (``node.meta["stack_trace"]``), outermost first."""
    return [traceback.FrameSummary(path, int(line), fn, lookup_line=False)
            for path, line, fn in _FRAME.findall(stack_trace or "")]


# -- how to name it --------------------------------------------------------------------
def frame_text(frame: traceback.FrameSummary) -> str:
    """``file:line: code`` of a frame (``cell [3], line 9: code`` for a notebook cell)."""
    where = source_location(frame.filename, frame.lineno)
    code = (frame.line or "").strip()
    return f"{where}: {code}" if code else where


def user_line(frames: Sequence[traceback.FrameSummary],
              also_skip: Callable[[str], bool] | None = is_generated, unknown: str = "") -> str:
    """``file:line: code`` of the innermost user frame of ``frames``, or ``unknown``.

    Args:
        frames: Frames outermost first.
        also_skip: Files that do not count as the user's (default: FX's generated code).
        unknown: The text when no frame is the user's.

    Returns:
        The location text.
    """
    frame = innermost_user_frame(frames, also_skip)
    return frame_text(frame) if frame is not None else unknown


def at_user_line(frames: Sequence[traceback.FrameSummary]) -> str:
    """``" at file:line: code"`` for the innermost user frame, or ``""`` (for a message)."""
    line = user_line(frames)
    return f" at {line}" if line else ""


def user_source(stack_trace: str | None) -> str:
    """``file.py:line`` (or ``cell [3], line 9``) of a stack trace's innermost user frame.

    The innermost frame of all when none is the user's; ``""`` for no stack trace.
    """
    frames = stack_trace_frames(stack_trace)
    frame = innermost_user_frame(frames) or (frames[-1] if frames else None)
    return source_location(frame.filename, frame.lineno, short=True) if frame else ""


def notebook_cell(path: str) -> str | None:
    """The execution count, as IPython shows it (``[3]``), of a file compiled from a cell.

    Asks the running IPython shell the way its own tracebacks do
    (``shell.compile.format_code_name``), so ``/tmp/ipykernel_123/1463351718.py``
    reads ``[3]``. IPython is never imported here: outside a running shell, or
    for any other file, the answer is None.

    Args:
        path: A source file name (a frame's ``filename``).

    Returns:
        ``"[3]"``, or None when ``path`` is not a cell of the running shell.
    """
    get_shell = getattr(sys.modules.get("IPython"), "get_ipython", None)
    shell = get_shell() if callable(get_shell) else None
    format_name = getattr(getattr(shell, "compile", None), "format_code_name", None)
    if not callable(format_name):
        return None
    try:
        named = format_name(path)
    except Exception:  # an IPython whose compiler does not know this name
        return None
    if not named or len(named) != 2:
        return None
    name = str(named[1])  # IPython's "In[3]"
    return name[2:] if name.startswith("In[") else name


def source_location(path: str, lineno: int | str | None, short: bool = False) -> str:
    """A source line as a user recognises it: ``cell [3], line 9`` or ``model.py:9``.

    Args:
        path: The file name.
        lineno: The line number.
        short: Give an ordinary file's base name only.

    Returns:
        The location text.
    """
    cell = notebook_cell(path)
    if cell is not None:
        return f"cell {cell}, line {lineno}"
    return f"{os.path.basename(path) if short else path}:{lineno}"
