"""The one attribute patch: set attributes for a block, put back exactly what was there.

Tracing replaces functions and methods of torch, of the user's classes and of
third-party modules for the length of a trace, and must leave them as it found
them, also when the trace fails. :func:`patched` is the only way jointlab does
that: it saves each object's *own* attribute (``vars(obj)``), not what
attribute lookup finds, so a staticmethod stays a staticmethod and an
attribute a class inherited is deleted again rather than copied onto it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["patched"]

_ABSENT: Any = object()


def _own(obj: Any, name: str) -> Any:
    """What ``obj`` itself holds under ``name`` (``_ABSENT`` when it inherits or lacks it)."""
    try:
        return vars(obj).get(name, _ABSENT)
    except TypeError:  # no __dict__ (slots, builtins): what lookup finds is all there is
        return getattr(obj, name, _ABSENT)


@contextlib.contextmanager
def patched(patches: Iterable[tuple[Any, str, Any]]) -> Iterator[None]:
    """Set ``obj.name = value`` for each patch inside the block; undo them all on exit.

    Patches apply in order and are undone in reverse order, even when the block
    (or a later patch) raises. An attribute the object did not hold itself is
    deleted again.

    Args:
        patches: ``(object, attribute name, new value)`` triples.

    Yields:
        Nothing.
    """
    saved: list[tuple[Any, str, Any]] = []
    try:
        for obj, name, value in patches:
            own = _own(obj, name)
            setattr(obj, name, value)
            saved.append((obj, name, own))
        yield
    finally:
        for obj, name, own in reversed(saved):
            if own is _ABSENT:
                delattr(obj, name)
            else:
                setattr(obj, name, own)
