"""Source lines as a user recognises them: ``model.py:9``, or ``cell [3], line 9`` in a notebook."""

from __future__ import annotations

import os
import sys

__all__ = ["notebook_cell", "source_location"]


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
