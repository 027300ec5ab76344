"""Refusals: misuse inside ``train_fn`` and raw torch errors become jointlab errors.

Tracing runs the user's ``train_fn`` once. Some things it may do would make
tracing change the model, or give a graph that hides an update:

- an optimizer step (the optimizer holds the *real* parameters, so under a
  fake mode that allows real inputs its in-place update writes them),
- any in-place write to a parameter (``p.add_``, ``p.data.mul_``, ``out=p``),
- its own ``loss.backward()`` or ``torch.autograd.grad`` (the joint graph
  takes the gradients itself),
- reading or writing ``.grad`` (``clip_grad_norm_``, ``zero_grad()``): this
  step's gradients do not exist while ``train_fn`` runs, so it would read the
  previous step's (baked into the graph as constants) or nothing.

:func:`tracing_guard` is active for the whole ``jl.trace`` call and
:func:`in_train_fn` around each call of ``train_fn``; both refuse these
before anything is written. :func:`refuse_compiled` refuses compiled
submodules before any compilation starts, and :func:`torch_errors` turns any
other exception that escapes into a :class:`~jointlab.errors.TraceError`
(or a subclass of the user's own exception type) with the cause chained
(:mod:`jointlab.runtime.torch_errors`, which running a graph uses too).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.optim import optimizer as torch_optimizer

from jointlab import torch_compat
from jointlab.errors import (
    CompiledModuleError,
    TrainFnMisuseError,
)
from jointlab.runtime.torch_errors import caller_line
from jointlab.torch_compat import is_compiled_module, op_schema, storage_id
from jointlab.trace.control_flow import cond_refusals
from jointlab.trace.function_checks import checked_user_code
from jointlab.trace.rng_calls import seed_call_refusals

_RETURN_LOSS = ("jl.trace computes the gradients itself: return the loss from train_fn, "
                "then use joint.run(model, inputs, accumulate=True) and step your optimizer "
                "outside train_fn.")
_CLIP_OUTSIDE = ("Inside train_fn this step's gradients do not exist yet (jl.trace computes "
                 "them after train_fn returns), so .grad holds the previous step's values or "
                 "nothing, and the graph would bake them in. Return the loss from train_fn and "
                 "work on the gradients after the graph ran: joint.run(model, inputs, "
                 "accumulate=True); torch.nn.utils.clip_grad_norm_(model.parameters(), "
                 "max_norm); opt.step(); opt.zero_grad().")
_GRAD_ACCESS = {torch.Tensor.grad.__get__: "reads", torch.Tensor.grad.__set__: "writes",
                torch.Tensor.grad.__delete__: "deletes"}
# Real parameter storages of the model being traced (a stack: traces may nest).
_REAL: list[dict[Any, str]] = []



# -- storages -------------------------------------------------------------------
def _param_storages(model: nn.Module) -> dict[Any, str]:
    out: dict[Any, str] = {}
    for name, p in model.named_parameters():
        key = storage_id(p)
        if key is not None:
            out.setdefault(key, name)
    return out


# -- the guards -------------------------------------------------------------------
def _refuse_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    raise TrainFnMisuseError(
        f"train_fn called {type(optimizer).__name__}.step(){caller_line()}. Tracing "
        "never updates the model, and an optimizer step inside the traced step would "
        f"write the real parameters. {_RETURN_LOSS}"
    )


@contextlib.contextmanager
def tracing_guard(model: nn.Module) -> Iterator[None]:
    """Refuse optimizer steps and record the real parameters for the whole trace.

    Args:
        model: The user's model, before any parameter is swapped out.

    Yields:
        Nothing; the guard is active inside the block.
    """
    # Without the hook, the parameter-write check below still refuses the step's update.
    hook = getattr(torch_optimizer, "register_optimizer_step_pre_hook", None)
    handle = hook(_refuse_step) if hook is not None else None
    _REAL.append(_param_storages(model))
    try:
        yield
    finally:
        _REAL.pop()
        if handle is not None:
            handle.remove()


def _refuse_backward(func: Any, _args: tuple, _kwargs: dict) -> None:
    name = "loss.backward()" if func is torch.Tensor.backward else (
        f"torch.autograd.{func.__name__}()")
    raise TrainFnMisuseError(f"train_fn called {name}{caller_line()}. {_RETURN_LOSS}")


def _grad_access_refusal(names: dict[int, str]) -> Any:
    def refuse(func: Any, args: tuple, _kwargs: dict) -> None:
        name = names.get(id(args[0])) if args else None
        what = f"parameter '{name}'" if name else "a tensor"
        raise TrainFnMisuseError(
            f"train_fn {_GRAD_ACCESS[func]} the .grad of {what}{caller_line()} (e.g. "
            f"clip_grad_norm_ or zero_grad() inside train_fn). {_CLIP_OUTSIDE}")
    return refuse


def _no_backward_handlers(names: dict[int, str]) -> dict[Any, Any]:
    """Handlers refusing ``backward()``, ``torch.autograd.backward``/``grad``, ``.grad`` access.

    Args:
        names: ``id(parameter)`` to its FQN, for the message.
    """
    grad_access = _grad_access_refusal(names)
    return {torch.Tensor.backward: _refuse_backward, torch.autograd.backward: _refuse_backward,
            torch.autograd.grad: _refuse_backward, **dict.fromkeys(_GRAD_ACCESS, grad_access)}


#: Per op: (position, name) of the arguments its schema writes (``Tensor(a!)``, ``out=``).
_WRITE_ARGS: dict[Any, tuple[tuple[int, str], ...]] = {}


def _write_args(func: Any) -> tuple[tuple[int, str], ...]:
    """``(position, name)`` of the arguments ``func``'s schema writes, cached per op."""
    hit = _WRITE_ARGS.get(func)
    if hit is None:
        hit = _WRITE_ARGS[func] = tuple(
            (i, arg.name) for i, arg in enumerate(getattr(op_schema(func), "arguments", ()))
            if arg.alias_info is not None and arg.alias_info.is_write)
    return hit


def _write_refusal(protected: dict[Any, str]) -> Any:
    """A check raising when an aten op writes in place into a parameter's storage."""
    def check(func: Any, args: tuple, kwargs: dict) -> None:
        for i, arg_name in _write_args(func):  # () for the ops that write nothing
            value = args[i] if i < len(args) else kwargs.get(arg_name)
            for t in value if isinstance(value, (list, tuple)) else (value,):
                name = protected.get(storage_id(t))
                if name is not None:
                    raise TrainFnMisuseError(
                        f"train_fn writes in place into parameter '{name}' ({func})"
                        f"{caller_line()}. Tracing must not change the model, and the graph "
                        "would replay the write on every run. Move parameter updates "
                        f"out of train_fn. {_RETURN_LOSS}"
                    )
    return check


def _param_write_mode(check: Any) -> Any:
    class _NoParamWrites(torch_compat.TorchDispatchMode):  # type: ignore[misc,name-defined]
        """Refuse any aten op that writes in place into a parameter's storage."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            check(func, args, kwargs)
            return func(*args, **kwargs)

    return _NoParamWrites()


def _param_writes_refused(protected: dict[Any, str], fake_mode: Any
                          ) -> contextlib.AbstractContextManager[Any]:
    """The write check, in the trace's own fake mode where it can, else as a dispatch mode."""
    check = _write_refusal(protected)
    if torch_compat.runs_checks(fake_mode):  # make_fx mode: one Python layer fewer per op
        return torch_compat.fake_mode_check(fake_mode, check)
    return _param_write_mode(check)


@contextlib.contextmanager
def in_train_fn(model: nn.Module, fake_mode: Any = None) -> Iterator[None]:
    """Refuse backward calls, ``.grad`` access, parameter writes, seeds and ``torch.cond``.

    The seed and generator-state calls and ``torch.cond`` are refused whoever makes
    them, the user's code or a library it calls (:mod:`jointlab.trace.rng_calls`,
    :mod:`jointlab.trace.control_flow`).

    Args:
        model: The model as ``train_fn`` sees it (parameters may be swapped
            for fake placeholders); the real ones come from :func:`tracing_guard`.
        fake_mode: The trace's fake mode; a ``torch_compat.checking_fake_mode``
            checks the writes itself (every op reaches it), otherwise a dispatch
            mode on top does.

    Yields:
        Nothing; the refusals are active inside the block.

    Raises:
        UnsupportedTorchError: This torch has no ``TorchDispatchMode`` to watch writes with.
    """
    protected = {**(_REAL[-1] if _REAL else {}), **_param_storages(model)}
    names = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}
    with checked_user_code(_no_backward_handlers(names)), \
            _param_writes_refused(protected, fake_mode), seed_call_refusals(), \
            cond_refusals():
        yield


# -- compiled submodules ----------------------------------------------------------
def _is_compiled(mod: nn.Module) -> bool:
    return is_compiled_module(mod)


def refuse_compiled(model: nn.Module) -> None:
    """Refuse a model holding ``torch.compile``-d modules, before anything compiles.

    Args:
        model: The user's model.

    Raises:
        CompiledModuleError: ``model`` or a submodule is compiled.
    """
    names = [name or "<the model>" for name, mod in model.named_modules() if _is_compiled(mod)]
    if names:
        raise CompiledModuleError(
            f"{', '.join(repr(n) for n in names)} is compiled with torch.compile; jl.trace "
            "traces eager modules and cannot trace through a compiled one. Trace the model "
            "before compiling it (or pass the original module, e.g. model.block._orig_mod "
            "for model.block = torch.compile(model.block)); to compile the joint graph, "
            "use joint.compile()."
        )
