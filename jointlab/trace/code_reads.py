"""The globals and closure variables the traced code names: what a trace reads outside the model.

``train_fn``'s closure (``scale``, a loss module ``crit``), a module global
(``SCALE = 0.5``), a global read inside an ``autograd.Function``: the trace
reads each once and bakes it. Two passes find them:

- before the trace, :func:`objects_to_watch` lists the *objects* (a config, a
  loss module) that ``train_fn`` and the model's own ``forward`` methods name,
  so the read recorder watches them and guards only the attributes read;
- after it, :func:`variables_read` lists the *plain* globals (see
  :mod:`jointlab.guard_values`) loaded by the code that actually ran (the read
  recorder's ``codes``: every function that touched a module attribute), by
  ``train_fn`` and the functions and classes those name, two levels deep, and
  ``train_fn``'s plain closure variables.

A name counts when the code loads it as a global (``LOAD_GLOBAL``/``LOAD_NAME``,
not an attribute of the same name) or as a free variable. torch's, the
standard library's and numpy's code is not scanned; their globals are not the
user's state.
"""

from __future__ import annotations

import dis
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from jointlab.guard_values import NO_FORM, value_form
from jointlab.sources import is_user_frame

__all__ = ["Variable", "objects_to_watch", "variables_read"]

_MISSING: Any = object()
_LOADS = {"LOAD_GLOBAL", "LOAD_NAME"}
_DEPTH = 2
_LIBRARIES = ("torch", "numpy", "typing", "jointlab.")
_NAMES_CACHE: dict[types.CodeType, frozenset[str]] = {}
Code = tuple[types.CodeType, dict[str, Any]]  # a code object and its globals


@dataclass(frozen=True)
class Variable:
    """A global or closure variable the traced code read, with a plain value.

    Attributes:
        target: ``"train_fn"`` for its closure, else ``"<module> globals"``.
        name: The variable's name.
        value: Its plain form at trace time.
        source: The code that names it (``qualname (file:line)``).
        read: Fetches the live value (a removed name reads as a sentinel equal to nothing).
    """

    target: str
    name: str
    value: Any
    source: str
    read: Callable[[], Any]


def _global_loads(code: types.CodeType) -> frozenset[str]:
    """Names ``code`` (and the code nested in it) loads as globals."""
    hit = _NAMES_CACHE.get(code)
    if hit is None:
        names = {i.argval for i in dis.get_instructions(code) if i.opname in _LOADS}
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                names |= _global_loads(c)
        hit = _NAMES_CACHE[code] = frozenset(names)
    return hit


def _is_library_file(path: str) -> bool:
    return not is_user_frame(path)


def _is_library(obj: Any) -> bool:
    mod = getattr(obj, "__module__", None) or ""
    return (mod.split(".")[0] in sys.stdlib_module_names or mod == "builtins"
            or mod.startswith(_LIBRARIES))


def _functions_of(value: Any) -> Iterator[types.FunctionType]:
    """``value`` itself when a function; an ``autograd.Function``'s own static methods."""
    if isinstance(value, types.FunctionType):
        yield value
    elif isinstance(value, type) and issubclass(value, torch.autograd.Function):
        for item in vars(value).values():
            fn = getattr(item, "__func__", item)
            if isinstance(fn, types.FunctionType):
                yield fn


def _code_of(fn: types.FunctionType) -> Code:
    return fn.__code__, fn.__globals__


def _followed(start: Iterable[Code]) -> list[Code]:
    """``start`` and the non-library functions and classes they name, ``_DEPTH`` levels deep."""
    order = [c for c in start if not _is_library_file(c[0].co_filename)]
    seen = {c[0] for c in order}
    frontier = list(order)
    for _ in range(_DEPTH):
        nxt = []
        for code, glb in frontier:
            for name in _global_loads(code):
                value = glb.get(name)
                if value is None or _is_library(value):
                    continue
                for fn in _functions_of(value):
                    if fn.__code__ not in seen and not _is_library_file(fn.__code__.co_filename):
                        seen.add(fn.__code__)
                        nxt.append(_code_of(fn))
        order.extend(nxt)
        frontier = nxt
    return order


def _where(code: types.CodeType) -> str:
    return f"{code.co_qualname} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"


def _cell_value(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _MISSING


def _train_fn(train_fn: Callable[..., Any]) -> types.FunctionType | None:
    fn = getattr(train_fn, "__func__", train_fn)
    return fn if isinstance(fn, types.FunctionType) else None


def _closure(fn: types.FunctionType) -> Iterator[tuple[str, types.CellType]]:
    yield from zip(fn.__code__.co_freevars, fn.__closure__ or ())


def _is_watchable(value: Any) -> bool:
    if isinstance(value, (type, types.ModuleType)) or not hasattr(value, "__dict__"):
        return False
    return isinstance(value, nn.Module) or not (callable(value) or _is_library(type(value)))


def objects_to_watch(model: nn.Module, train_fn: Callable[..., Any]
                     ) -> list[tuple[str, Any, Callable[[], Any]]]:
    """Objects ``train_fn`` and the model's own ``forward`` methods name: watch their reads.

    Args:
        model: The model.
        train_fn: The training step.

    Returns:
        ``(label, object, reader)``: ``"train_fn: crit"`` or ``"global CFG"``, the object,
        and a function fetching the live one.
    """
    fns = [f for f in [_train_fn(train_fn)] if f is not None]
    fns += [type(m).forward for m in model.modules() if not _is_library(type(m))
            and isinstance(type(m).forward, types.FunctionType)]
    out, seen = [], set()
    for code, glb in _followed(_code_of(f) for f in fns):
        for name in sorted(_global_loads(code)):
            value = glb.get(name, _MISSING)
            if name not in seen and _is_watchable(value):
                seen.add(name)
                out.append((f"global {name}", value, lambda g=glb, n=name: g.get(n, _MISSING)))
    root = fns[0] if fns and fns[0] is _train_fn(train_fn) else None
    for name, cell in _closure(root) if root is not None else ():
        value = _cell_value(cell)
        if _is_watchable(value):
            out.append((f"train_fn: {name}", value, lambda c=cell: _cell_value(c)))
    return out


def variables_read(codes: dict[types.CodeType, dict[str, Any]],
                   train_fn: Callable[..., Any]) -> list[Variable]:
    """The plain globals the code that ran loads, and ``train_fn``'s plain closure variables.

    Args:
        codes: The code objects that ran while traced, with their globals.
        train_fn: The training step (its code counts as run).

    Returns:
        One :class:`Variable` per name, first finder wins.
    """
    root = _train_fn(train_fn)
    start = list(codes.items()) + ([_code_of(root)] if root is not None else [])
    out: list[Variable] = []
    seen: set[tuple[str, str]] = set()
    for code, glb in _followed(start):
        target = f"{glb.get('__name__', '?')} globals"
        for name in sorted(_global_loads(code)):
            form = value_form(glb.get(name, _MISSING))
            if name in glb and form is not NO_FORM and (target, name) not in seen:
                seen.add((target, name))
                out.append(Variable(target, name, form, _where(code),
                                    lambda g=glb, n=name: g.get(n, _MISSING)))
    for name, cell in _closure(root) if root is not None else ():
        form = value_form(_cell_value(cell))
        if form is not NO_FORM:
            out.append(Variable("train_fn", name, form, _where(root.__code__),
                                lambda c=cell: _cell_value(c)))
    return out
