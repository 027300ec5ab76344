"""What each recorded fact reads on the live model and in torch now.

:mod:`jointlab.assumptions` records facts at trace time; this module reads
the same facts again before each run: a module's flag and class, a
parameter's ``requires_grad``, every hook by function (:func:`hooks_now`), an
attribute path the trace read (walked from its module, or from a ``train_fn``
variable through the fact's reader), a global or closure variable, and a
process-wide setting (:mod:`jointlab.global_state`). Values come back in the
plain form guards compare (:mod:`jointlab.guard_values`), or as
:data:`MISSING` (the module, parameter or attribute is gone) or
:data:`UNKNOWN` (nothing in this process can read it: a loaded graph's closure
variable).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from jointlab.global_state import SETTINGS
from jointlab.guard_values import value_form
from jointlab.torch_compat import global_module_hooks, module_hooks, tensor_hooks

if TYPE_CHECKING:
    from jointlab.facts import Assumption

__all__ = ["INSTALLED", "MISSING", "ROOT", "UNKNOWN", "Live", "class_name", "current",
           "hook_name", "hooks_now"]

ROOT = "<the model>"
_READERS = {s.name: s.read for s in SETTINGS}


class _Missing:
    def __repr__(self) -> str:
        return "(missing)"


#: A fact whose module, parameter or attribute is gone now.
MISSING: Any = _Missing()
#: A fact nothing in this process can read (a loaded graph's closure variable).
UNKNOWN: Any = object()


def class_name(obj: Any) -> str:
    """``obj``'s class as ``module.QualName`` (what a ``class`` fact holds)."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def hook_name(fn: Any) -> str:
    """A hook function as guards show it: ``qualname (file:line)`` when it has code."""
    fn = getattr(fn, "__func__", fn)
    inner = getattr(fn, "func", None) if not hasattr(fn, "__code__") else None  # a partial
    code = getattr(fn, "__code__", None) or getattr(inner, "__code__", None)
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    if code is None:
        return name
    return f"{name} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"


#: Where the process-wide module hooks (register_module_forward_hook...) are listed.
GLOBAL = "<every module>"
#: The key of a hooks fact that lists the hooks the traced step itself registers.
INSTALLED = "(registered by the traced step)"


def hooks_now(model: nn.Module, ignore: frozenset[str] = frozenset()
              ) -> dict[str, tuple[str, ...]]:
    """Every hook on ``model``'s modules and parameters: ``"fqn kind" -> hook names``.

    Args:
        model: The model.
        ignore: Hook names left out (those the traced step registers itself: eager's
            first step registers them again, and the graph ran with them).

    Returns:
        Only the places that hold a hook, so a model without hooks gives ``{}``.
    """
    live = Live.of(model)
    return _hooks(live.modules, live.params, ignore)


def _hooks(modules: dict[str, nn.Module], params: dict[str, nn.Parameter],
           ignore: frozenset[str]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    places = [(f"{GLOBAL} {k}", fns) for k, fns in global_module_hooks().items()]
    places += [(f"{fqn} {k}", fns) for fqn, mod in modules.items()
               for k, fns in module_hooks(mod).items()]
    places += [(f"{fqn} parameter hooks", tensor_hooks(p)) for fqn, p in params.items()]
    for key, fns in places:
        names = tuple(n for n in map(hook_name, fns) if n not in ignore)
        if names:
            out[key] = names
    return out


def _hooks_fact_now(fact: Assumption, live: Live) -> dict[str, Any]:
    installed = fact.value.get(INSTALLED, ()) if isinstance(fact.value, dict) else ()
    now: dict[str, Any] = _hooks(live.modules, live.params, frozenset(installed))
    if installed:
        now[INSTALLED] = installed
    return now


@dataclass
class Live:
    """The live model, indexed once per check."""

    model: nn.Module
    modules: dict[str, nn.Module]
    params: dict[str, nn.Parameter]

    @classmethod
    def of(cls, model: nn.Module) -> Live:
        """Index ``model``'s modules (``"<the model>"`` for the root) and parameters."""
        return cls(model, {fqn or ROOT: mod for fqn, mod in model.named_modules()},
                   dict(model.named_parameters()))


_STEP = re.compile(r"\.?([A-Za-z_]\w*)|\[(-?\d+|'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")\]")


def _steps(path: str) -> list[tuple[str, Any]]:
    """``"cfgs[0].scale"`` as ``[("attr", "cfgs"), ("item", 0), ("attr", "scale")]``."""
    out = []
    for m in _STEP.finditer(path):
        out.append(("attr", m.group(1)) if m.group(1) else ("item", ast.literal_eval(m.group(2))))
    return out


def _step(obj: Any, how: str, key: Any) -> Any:
    if how == "attr":
        return getattr(obj, key, MISSING)
    try:
        return obj[key]
    except (LookupError, TypeError):
        return MISSING


def _walk(obj: Any, path: str) -> Any:
    """The form of ``obj.a[0].b`` for ``path`` ``"a[0].b"``; :data:`MISSING` when a step is gone."""
    for how, key in _steps(path):
        obj = _step(obj, how, key)
        if obj is MISSING:
            return MISSING
    return value_form(obj)


def _root(fact: Assumption, live: Live) -> Any:
    mod = live.modules.get(fact.target)
    if mod is not None:
        return mod
    return fact.reader() if fact.reader is not None else UNKNOWN


def _module_fact(fact: Assumption, live: Live) -> Any:
    mod = live.modules.get(fact.target)
    if mod is None:
        return MISSING
    if fact.kind == "training":
        return bool(mod.training)
    if fact.kind == "class":
        return class_name(mod)
    return vars(mod).get(fact.attr, MISSING)  # an old archive's "hyperparameter"


def current(fact: Assumption, live: Live) -> Any:
    """What ``fact`` reads now, in plain form (or :data:`MISSING` / :data:`UNKNOWN`).

    Args:
        fact: A recorded fact (any kind but ``rank``).
        live: The live model, indexed.

    Returns:
        The value to compare with ``fact.value``.
    """
    if fact.kind == "global":
        read = _READERS.get(fact.attr)
        return UNKNOWN if read is None else read()
    if fact.kind == "requires_grad":
        p = live.params.get(fact.target)
        return MISSING if p is None else bool(p.requires_grad)
    if fact.kind == "hooks":
        return _hooks_fact_now(fact, live)
    if fact.kind == "variable":
        return UNKNOWN if fact.reader is None else value_form(fact.reader())
    if fact.kind == "read":
        root = _root(fact, live)
        return root if root is UNKNOWN else _walk(root, fact.attr)
    return _module_fact(fact, live)
