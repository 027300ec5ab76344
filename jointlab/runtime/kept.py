"""Run eager on the user's own model and leave it exactly as it was.

An eager reference (``jl.compare``'s, the compiled stepper's ``boundary(eager=True)``)
must compute what ``loss.backward()`` on the user's model computes: with its
parameter hooks, module hooks, globals and swapped modules. A ``copy.deepcopy``
does not keep all of that (a Parameter's deep copy drops its hooks, its ``.grad``
and its Python attributes), so the reference runs on the model itself inside
:func:`model_kept`, which then puts back everything one step can change:
parameter and buffer objects and values (BatchNorm's running statistics are
updated in place), gradients (object and value), ``requires_grad``, training
flags, every module's plain attributes (a counter bumped in forward) and the
global RNG (CPU and CUDA).

Only a run on another device or in another dtype needs a copy:
:func:`hooked_copy` registers the parameters' hooks on it again, and says what
a copy still cannot carry. :func:`model_on` picks between the two.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from jointlab.runtime.snapshot import HookCopies, ModelSnapshot
from jointlab.torch_compat import post_accumulate_grad_hooks, tensor_hooks

__all__ = ["KeptModel", "hooked_copy", "model_kept", "model_on"]

_MISSING = object()


@dataclass
class KeptModel:
    """Everything one eager step may change on a model, to put back afterwards.

    Attributes:
        identity: References to the parameter, buffer and gradient objects, their
            ``requires_grad``, the training flags and the global RNG state.
        values: ``(tensor, clone)`` for every parameter, buffer, gradient and plain
            tensor attribute of a module (their values, restored in place).
        attrs: ``(module, shallow copy of its __dict__)``: plain attributes.
        hooks: ``(live hook dict, copy)`` for every module: a library that registers
            hooks on its first forward (transformers' output capturing, beside a flag
            attribute restored with ``attrs``) gets both undone together.
    """

    identity: ModelSnapshot
    values: list[tuple[torch.Tensor, torch.Tensor]]
    attrs: list[tuple[nn.Module, dict[str, Any]]]
    hooks: HookCopies

    @classmethod
    def take(cls, model: nn.Module) -> KeptModel:
        """Record ``model``'s state (values cloned, attributes by reference).

        Args:
            model: The user's model.

        Returns:
            A record whose :meth:`restore` puts the model back as it is now.
        """
        identity = ModelSnapshot.take(model)
        attrs = [(mod, dict(mod.__dict__)) for mod in model.modules()]
        tensors = [x for t, grad, _ in identity.tensors for x in (t, grad)]
        tensors += [v for _, d in attrs for v in d.values() if isinstance(v, torch.Tensor)]
        values, seen = [], set()
        for t in tensors:
            if t is None or id(t) in seen or t.device.type == "meta":  # meta: no values
                continue
            seen.add(id(t))
            values.append((t, t.detach().clone()))
        return cls(identity, values, attrs, HookCopies.take(model.modules()))

    def restore(self) -> None:
        """Put back attributes, tensor objects, flags, the RNG, then every value."""
        for mod, saved in self.attrs:
            live = mod.__dict__
            for name in [n for n in live if n not in saved]:
                del live[name]
            for name, value in saved.items():
                if live.get(name, _MISSING) is not value:
                    live[name] = value
        self.hooks.restore()
        self.identity.restore()
        with torch.no_grad():
            for t, saved in self.values:
                if (t.shape, t.dtype, t.device) != (saved.shape, saved.dtype, saved.device):
                    t.data = saved  # the step swapped the tensor's data
                elif not torch.equal(t, saved):  # copy only what changed: no version bump
                    t.copy_(saved)


@contextlib.contextmanager
def model_kept(model: nn.Module) -> Iterator[nn.Module]:
    """Run something on ``model`` itself, then leave it exactly as it was.

    Side effects outside the model (a list a hook appends to, a global counter)
    happen as in one eager step: only the model and the global RNG are put back.

    Args:
        model: The user's model.

    Yields:
        ``model`` itself.
    """
    kept = KeptModel.take(model)
    try:
        yield model
    finally:
        kept.restore()


def hooked_copy(model: nn.Module, device: str | torch.device,
                dtype: torch.dtype | None = None) -> nn.Module:
    """A deep copy of ``model`` on ``device`` (floating state in ``dtype``) with its hooks.

    Each parameter's ``register_hook`` and ``register_post_accumulate_grad_hook``
    hooks, which a Parameter's deep copy drops, are registered on the copy's
    parameter again (the same functions). Module hooks are copied by ``deepcopy``
    itself. What a copy cannot carry: code that refers to the original model's
    objects (a hook, ``train_fn`` or global that closes over the user's model,
    a submodule or a parameter acts on the original, not the copy), identity
    checks and weak references to them, a Parameter's own Python attributes,
    and tensors the model shares with objects outside it (the copy has its own).

    Args:
        model: The user's model (not changed).
        device: Where the copy lives.
        dtype: Cast the copy's floating-point parameters and buffers (e.g. float64).

    Returns:
        The copy.

    Raises:
        jointlab.errors.UnsupportedTorchError: This torch keeps a tensor's hooks
            where jointlab cannot read them.
    """
    dup = copy.deepcopy(model).to(device)
    if dtype is not None:
        dup = dup.to(dtype)
    for (_, src), (_, dst) in zip(model.named_parameters(), dup.named_parameters()):
        if not dst.requires_grad:  # its hooks never run; register_hook would refuse
            continue
        for fn in tensor_hooks(src):
            dst.register_hook(fn)
        for fn in post_accumulate_grad_hooks(src):
            dst.register_post_accumulate_grad_hook(fn)
    return dup


def model_on(model: nn.Module, device: str | torch.device) -> contextlib.AbstractContextManager:
    """The model an eager step on ``device`` runs on, as a context manager.

    ``model`` itself inside :func:`model_kept` when all its parameters and buffers
    are on ``device`` (what the user holds, left as it was); otherwise a
    :func:`hooked_copy` on ``device``.

    Args:
        model: The user's model.
        device: Where the step runs.

    Returns:
        A context manager yielding the model to run.
    """
    where = torch.empty(0, device=device).device  # "cuda" -> "cuda:<current>"
    if all(t.device == where for t in (*model.parameters(), *model.buffers())):
        return model_kept(model)
    return contextlib.nullcontext(hooked_copy(model, where))
