"""What the traced step read from Python objects, and what it wrote: recorded by the trace.

A joint graph replays ops, not Python: every attribute the traced code read
and branched on, scaled by or passed to an op is baked in. Like Dynamo's
guards, jointlab records what the trace actually read instead of a list of
likely suspects. While ``train_fn`` is traced, :class:`ReadRecorder` watches
the model's modules and every object reached through them (an HF config, a
user's options object, a loss module outside the model): their classes'
``__getattribute__`` and ``__setattr__`` are wrapped for the length of the
trace (and restored, also on failure), and each read of a watched object's
attribute is kept as ``(root, dotted path) -> plain form`` (see
:mod:`jointlab.guard_values`). Reads of values with no plain form (tensors,
functions, submodules) are not value guards; an object read is watched in
turn, so ``self.config.hidden_dropout`` is recorded under the model's path.

Writes are side effects: a counter bumped in ``forward``, a list of stashed
maps, a state attribute a forward updates. The graph does not repeat them, and
a value the step itself changes cannot be a guard (it differs on every eager
step). So a written attribute is never guarded; it is reported
(:attr:`ReadRecorder.side_effects`, with the user's line), and at the end of
the trace every written attribute gets its old value back: tracing leaves the
model as it was, Python attributes included.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from jointlab.guard_values import NO_FORM, plain_form, same_form
from jointlab.live_state import hook_name
from jointlab.patching import patched
from jointlab.runtime.snapshot import HookCopies
from jointlab.sources import source_location
from jointlab.torch_compat import is_module_slot, is_parameter_cache, module_internal_names

__all__ = ["ROOT", "ReadRecorder", "SideEffect", "recording_reads"]

ROOT = "<the model>"
_MISSING: Any = object()
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class whose attributes Python code may set
_MAX_ITEMS_WATCHED = 1024  # objects of a longer list are not watched one by one
_NOT_WATCHED = (torch.Tensor, type, types.ModuleType, types.FunctionType, types.MethodType,
                types.BuiltinFunctionType)


@dataclass(frozen=True)
class SideEffect:
    """A Python attribute the traced step changed (the graph does not change it).

    Attributes:
        target: The watched root (module FQN, ``"<the model>"`` or a ``train_fn`` name).
        path: The attribute's dotted path under ``target``.
        before: Its value before the trace (a short repr).
        after: Its value the trace left (a short repr).
        source: The user's line that wrote it.
    """

    target: str
    path: str
    before: str
    after: str
    source: str


def _short(value: Any) -> str:
    text = "(unset)" if value is _MISSING else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _caller_line(depth: int) -> str:
    frame = sys._getframe(depth)
    return source_location(frame.f_code.co_filename, frame.f_lineno, short=True)


def _own_dict(obj: Any) -> dict[str, Any] | None:
    try:
        d = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None
    return d if isinstance(d, dict) else None


def _can_patch(cls: type) -> bool:
    return bool(cls.__flags__ & _HEAPTYPE) and not cls.__module__.startswith("torch")


class ReadRecorder:
    """The reads and writes of watched objects while a trace runs.

    Attributes:
        reads: ``(target, path) -> plain form`` of every first read of a watched
            attribute that the step did not write itself, in read order.
        sources: ``(target, path) -> the line that read it``.
        side_effects: Filled by :meth:`finish`: the attributes the step changed.
        codes: The code objects that read an attribute of any module or watched
            object's class while traced, with their globals: the code that ran.
        installed_hooks: Filled by :meth:`finish`: the hooks the step registered on
            the model's modules (removed again), by name.
        tensors: ``(target, path) -> tensor`` for plain tensors read (no parameter or
            buffer): baked into the graph as constants, guarded by value after the trace.
    """

    def __init__(self) -> None:
        self.reads: dict[tuple[str, str], Any] = {}
        self.sources: dict[tuple[str, str], str] = {}
        self.side_effects: list[SideEffect] = []
        self.codes: dict[types.CodeType, dict[str, Any]] = {}
        self.tensors: dict[tuple[str, str], torch.Tensor] = {}
        self._roots: dict[int, tuple[str, str]] = {}  # id(obj.__dict__) -> (target, path)
        self._alive: list[Any] = []
        self._written: dict[tuple[int, str], tuple[Any, str, Any, tuple[str, str], str]] = {}
        self._written_keys: set[tuple[str, str]] = set()
        self._patched: set[type] = set()
        self._patches = contextlib.ExitStack()  # one jointlab.patching.patched per class
        #: id -> (container, its items before, key, quiet: torch's cache of parameters)
        self._containers: dict[int, tuple[Any, Any, tuple[str, str], bool]] = {}
        self._hooks = HookCopies([])
        self.installed_hooks: list[str] = []
        self._busy = False

    # -- watching -------------------------------------------------------------
    def watch(self, obj: Any, target: str, path: str = "") -> None:
        """Record reads of ``obj``'s attributes as ``(target, path.attr)``.

        Args:
            obj: An object with a ``__dict__`` (a module, a config, an options object).
            target: The root name guards show (module FQN, ``"train_fn: cfg"``).
            path: The dotted path from ``target`` to ``obj`` ("" for the root itself).
        """
        d = _own_dict(obj)
        if d is None or id(d) in self._roots:
            return
        self._roots[id(d)] = (target, path)
        self._alive.append(obj)
        cls = type(obj)
        if isinstance(obj, nn.Module):
            return
        if _can_patch(cls):
            self._patch(cls)
        else:  # reads of a library object (a SimpleNamespace) cannot be seen: all of it
            self._guard_whole(obj, d, (target, path))

    def _guard_whole(self, obj: Any, d: dict[str, Any], key: tuple[str, str]) -> None:
        for name, value in d.items():
            form = plain_form(value)
            if form is not NO_FORM and not name.startswith("__"):
                at = (key[0], f"{key[1]}.{name}" if key[1] else name)
                self.reads.setdefault(at, form)
                self.sources.setdefault(at, f"all of this {type(obj).__name__}: its reads "
                                            "cannot be watched")

    def watch_model(self, model: nn.Module) -> None:
        """Watch every module of ``model`` under its FQN, and nn.Module's attribute access.

        Each module's hook dicts are copied too: a library that registers hooks on its
        first forward (transformers' output capturing, with a flag attribute it sets)
        gets both undone together, and installs them again on eager's next step.
        """
        self._patch(nn.Module)
        for fqn, mod in model.named_modules():
            self.watch(mod, fqn or ROOT)
        self._hooks = HookCopies.take(model.modules())

    def _patch(self, cls: type) -> None:
        if cls in self._patched:
            return
        self._patched.add(cls)
        get, put, rec, codes = cls.__getattribute__, cls.__setattr__, self, self.codes

        def __getattribute__(obj: Any, name: str) -> Any:  # noqa: N807
            frame = sys._getframe(1)
            codes[frame.f_code] = frame.f_globals
            value = get(obj, name)
            if not rec._busy and name[:2] != "__":
                rec._on_read(obj, name, value)
            return value

        def __setattr__(obj: Any, name: str, value: Any) -> None:  # noqa: N807
            if not rec._busy:
                rec._on_write(obj, name)
            put(obj, name, value)

        self._patches.enter_context(patched([(cls, "__getattribute__", __getattribute__),
                                             (cls, "__setattr__", __setattr__)]))

    def _watch_items(self, value: Any, key: tuple[str, str]) -> None:
        """Watch the objects a list, tuple or dict holds, as ``path[i]`` / ``path['k']``."""
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, item in list(items)[:_MAX_ITEMS_WATCHED]:
            if isinstance(k, (int, str)) and not isinstance(item, _NOT_WATCHED) \
                    and not callable(item) and plain_form(item) is NO_FORM:
                self.watch(item, key[0], f"{key[1]}[{k!r}]")

    def _unpatch(self) -> None:
        self._patches.close()
        self._patched.clear()

    # -- events ---------------------------------------------------------------
    def _where(self, obj: Any, name: str) -> tuple[dict[str, Any], tuple[str, str]] | None:
        d = _own_dict(obj)
        root = None if d is None else self._roots.get(id(d))
        if root is None or name in module_internal_names():
            return None
        target, path = root
        return d, (target, f"{path}.{name}" if path else name)

    def _on_read(self, obj: Any, name: str, value: Any) -> None:
        self._busy = True
        try:
            found = self._where(obj, name)
            if found is None or found[1] in self._written_keys or found[1] in self.reads:
                return
            key = found[1]
            form = plain_form(value)
            if form is not NO_FORM and not _values_never_depend_on(obj, name):
                self.reads[key] = form
                self.sources[key] = _caller_line(3)
            elif isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                self.tensors[key] = value  # its form reads data: after the trace
                self.sources[key] = _caller_line(3)
            if type(value) in (list, dict, set) and id(value) not in self._containers:
                self._containers[id(value)] = (value, _shallow(value), key,
                                               is_parameter_cache(obj, name))
            if form is NO_FORM and type(value) in (list, tuple, dict):
                self._watch_items(value, key)
            elif form is NO_FORM and not isinstance(value, _NOT_WATCHED) and not callable(value):
                self.watch(value, key[0], key[1])
        finally:
            self._busy = False

    def _on_write(self, obj: Any, name: str) -> None:
        self._busy = True
        try:
            found = self._where(obj, name)
            if found is None or (isinstance(obj, nn.Module) and is_module_slot(obj, name)):
                return
            d, key = found
            self._written_keys.add(key)
            slot = (id(d), name)
            if slot not in self._written:
                self._written[slot] = (obj, name, d.get(name, _MISSING), key, _caller_line(3))
        finally:
            self._busy = False

    # -- the end --------------------------------------------------------------
    def finish(self) -> None:
        """Stop watching, note the side effects and put every written attribute back."""
        self._unpatch()
        for obj, name, old, key, line in self._written.values():
            d = _own_dict(obj)
            new = d.get(name, _MISSING)
            if not _unchanged(old, new) and not is_parameter_cache(obj, name):
                self.side_effects.append(SideEffect(key[0], key[1], _short(old), _short(new),
                                                    line))
            if old is _MISSING:
                d.pop(name, None)
            else:
                d[name] = old
        self._restore_containers()
        self.installed_hooks = [hook_name(fn) for fn in self._hooks.restore() if callable(fn)]
        for key in self._written_keys:
            self.reads.pop(key, None)
            self.tensors.pop(key, None)
        self._alive.clear()

    def _restore_containers(self) -> None:
        """Note and undo in-place changes to lists, dicts and sets read from watched objects."""
        for value, before, key, quiet in self._containers.values():
            if _same_items(value, before):
                continue
            if not quiet:  # a cache of parameters follows the trace's fakes: put back silently
                self.side_effects.append(SideEffect(key[0], key[1], _short(before),
                                                    _short(_shallow(value)), "in place"))
            self._written_keys.add(key)
            if isinstance(value, list):
                value[:] = before
            else:
                value.clear()
                value.update(before)
        self._containers.clear()


def _shallow(value: Any) -> Any:
    return type(value)(value) if not isinstance(value, dict) else dict(value)


def _same_items(value: Any, before: Any) -> bool:
    """Whether a container holds the very same items (by identity) as its copy ``before``."""
    if len(value) != len(before):
        return False
    if isinstance(value, dict):
        return value.keys() == before.keys() and all(value[k] is before[k] for k in value)
    if isinstance(value, set):
        return value == before
    return all(a is b for a, b in zip(value, before))


def _values_never_depend_on(obj: Any, name: str) -> bool:
    """torch.nn's ``inplace`` flags: they change where a result is written, not its value."""
    return name == "inplace" and type(obj).__module__.startswith("torch.nn")


def _unchanged(old: Any, new: Any) -> bool:
    if old is new:
        return True
    a, b = plain_form(old), plain_form(new)
    return a is not NO_FORM and b is not NO_FORM and same_form(a, b)


@contextlib.contextmanager
def recording_reads(model: nn.Module) -> Iterator[ReadRecorder]:
    """Record what the block reads from ``model`` (and what it reaches), then restore writes.

    Args:
        model: The model being traced.

    Yields:
        The recorder; its ``reads`` and ``side_effects`` are complete after the block.
    """
    rec = ReadRecorder()
    try:
        rec.watch_model(model)
        yield rec
    finally:
        rec.finish()
