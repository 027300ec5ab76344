"""Record and restore everything tracing could touch on the user's model.

Tracing swaps fake tensors into the model's modules. torch restores them
itself, except for a submodule reachable by two attribute paths (pytorch
issue 164759), so jointlab restores the model on its own from an identity
snapshot taken before tracing. The snapshot holds references, not copies, so
it costs nothing per byte of the model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from jointlab.torch_compat import hook_dicts, module_stores


@dataclass
class ModelSnapshot:
    """References to every parameter, buffer, gradient and flag of a model."""

    modules: list[tuple[nn.Module, dict, dict, bool]] = field(default_factory=list)
    tensors: list[tuple[torch.Tensor, torch.Tensor | None, bool]] = field(default_factory=list)
    cpu_rng: torch.Tensor | None = None
    cuda_rng: list[torch.Tensor] | None = None

    @classmethod
    def take(cls, model: nn.Module) -> ModelSnapshot:
        """Snapshot ``model`` and the global RNG state.

        Args:
            model: The user's model.

        Returns:
            A snapshot whose :meth:`restore` undoes any swap done since.
        """
        snap = cls()
        seen: set[int] = set()
        for mod in model.modules():  # deduplicated; shared submodules once
            params, buffers = module_stores(mod)
            snap.modules.append((mod, dict(params), dict(buffers), mod.training))
            for t in (*params.values(), *buffers.values()):
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    snap.tensors.append((t, t.grad, t.requires_grad))
        snap.cpu_rng = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            snap.cuda_rng = torch.cuda.get_rng_state_all()
        return snap

    def restore(self) -> None:
        """Put back every recorded tensor object, gradient, flag and RNG state."""
        for mod, params, buffers, training in self.modules:
            for store, saved in zip(module_stores(mod), (params, buffers)):
                for name in [n for n in store if n not in saved]:
                    del store[name]
                for name, obj in saved.items():
                    if store.get(name, None) is not obj or name not in store:
                        store[name] = obj
            mod.training = training
        for t, grad, requires_grad in self.tensors:
            if t.grad is not grad:
                t.grad = grad
            if t.requires_grad != requires_grad and t.is_leaf:
                t.requires_grad_(requires_grad)
        if self.cpu_rng is not None:
            torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


@dataclass
class HookCopies:
    """Copies of modules' hook dicts, to put back after a step that may register hooks.

    A library may register hooks on a module's first forward (transformers' output
    capturing, beside a flag attribute it sets); whoever restores the flag must
    restore the hooks with it, or the next forward registers them a second time.
    """

    copies: list[tuple[dict[Any, Any], dict[Any, Any]]]

    @classmethod
    def take(cls, modules: Iterable[nn.Module]) -> HookCopies:
        """Copy every hook dict of ``modules`` (their live dicts are kept by reference)."""
        return cls([(d, dict(d)) for mod in modules for d in hook_dicts(mod)])

    def restore(self) -> list[Any]:
        """Put every dict back as copied.

        Returns:
            The entries registered since the copy (hook functions and their flags).
        """
        added = []
        for live, saved in self.copies:
            if live != saved:
                added.extend(v for k, v in live.items() if k not in saved)
                live.clear()
                live.update(saved)
        return added
