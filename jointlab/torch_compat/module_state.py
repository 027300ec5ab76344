"""nn.Module's private bookkeeping that the guards read: its hook dicts and internal names.

A joint graph bakes the hooks a module had when it was traced (forward hooks
run inside the traced forward; backward hooks inside the traced backward), so
the guards record them and compare them on every run. The dicts that hold
them are private attributes of ``nn.Module``; this module is the one place
that names them. :func:`module_internal_names` lists the attributes every
``nn.Module`` keeps for itself, which the read recorder never guards.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

#: Hook dicts of one module, by the name the guards show (attribute names as strings).
_HOOK_DICTS = {
    "forward pre-hooks": "_forward_pre_hooks",
    "forward hooks": "_forward_hooks",
    "backward pre-hooks": "_backward_pre_hooks",
    "backward hooks": "_backward_hooks",
}


def module_hooks(mod: nn.Module) -> dict[str, tuple[Any, ...]]:
    """The hooks registered on ``mod``, by kind, in registration order.

    Args:
        mod: Any module.

    Returns:
        ``{"forward hooks": (fn, ...), ...}`` for each kind that holds a hook (a torch
        without one of the dicts simply has none of that kind).
    """
    out = {}
    for kind, attr in _HOOK_DICTS.items():
        hooks = vars(mod).get(attr)
        if hooks:
            out[kind] = tuple(hooks.values())
    return out


@functools.cache
def module_internal_names() -> frozenset[str]:
    """Attribute names ``nn.Module`` itself keeps on every instance (never user state)."""
    names = set(vars(nn.Module())) | {"_compiled_call_impl", "_is_full_backward_hook",
                                      "_version", "call_super_init", "dump_patches"}
    return frozenset(names)


def is_module_slot(mod: nn.Module, name: str) -> bool:
    """Whether ``name`` is a parameter, buffer or submodule of ``mod`` (not a plain attribute)."""
    d = vars(mod)
    return any(name in (d.get(store) or ()) for store in ("_parameters", "_buffers", "_modules"))


#: Attributes torch.nn keeps as caches of a module's own parameters, rebuilt from them:
#: an RNN's flat weight list follows ``self.weight_ih_l0 = ...`` (so it follows the
#: fake parameters a trace swaps in) and its weak references.
_PARAMETER_CACHES: tuple[tuple[type, frozenset[str]], ...] = (
    (nn.RNNBase, frozenset({"_flat_weights", "_flat_weight_refs"})),
)


def is_parameter_cache(obj: Any, name: str) -> bool:
    """Whether ``obj.name`` is torch's cache of ``obj``'s own parameters (not user state)."""
    return any(isinstance(obj, cls) and name in names for cls, names in _PARAMETER_CACHES)


def hook_dicts(mod: nn.Module) -> list[dict[Any, Any]]:
    """The live dicts that hold ``mod``'s hooks and their flags (to snapshot and restore)."""
    names = (*_HOOK_DICTS.values(), "_forward_hooks_with_kwargs",
             "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")
    return [d for d in (vars(mod).get(n) for n in names) if isinstance(d, dict)]


#: The process-wide module hooks (``torch.nn.modules.module.register_module_forward_hook``
#: and kin), by the name the guards show.
_GLOBAL_HOOK_DICTS = {
    "forward pre-hooks": "_global_forward_pre_hooks",
    "forward hooks": "_global_forward_hooks",
    "backward pre-hooks": "_global_backward_pre_hooks",
    "backward hooks": "_global_backward_hooks",
}


def global_module_hooks() -> dict[str, tuple[Any, ...]]:
    """The hooks registered for every module at once, by kind, in registration order.

    Returns:
        ``{"forward hooks": (fn, ...), ...}`` for each kind that holds a hook.
    """
    from torch.nn.modules import module as module_mod

    out = {}
    for kind, attr in _GLOBAL_HOOK_DICTS.items():
        hooks = getattr(module_mod, attr, None)
        if hooks:
            out[kind] = tuple(hooks.values())
    return out
