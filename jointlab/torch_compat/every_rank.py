"""Every simulated rank at once: torch's ``LocalTensorMode`` with exact collectives.

:func:`every_rank_mode` (``compat.LocalTensorMode(ranks)``) is the mode jointlab
enters for ``world.all_ranks()``: torch's ``LocalTensorMode``, except that a
collective of plain tensors (made outside the mode) runs on every rank's copy
of the value and gives each rank its own result.
:func:`every_rank_mode_active` says whether such a mode is entered. Each rank's
values of a ``LocalTensor`` are read by
:func:`jointlab.torch_compat.distributed.per_rank_values`.
"""

from __future__ import annotations

from typing import Any

import torch

from jointlab.torch_compat.distributed import per_rank_values


def _is_collective(func: Any) -> bool:
    """A collective op (``c10d``, functional) or DTensor's ``shard_dim_alltoall``."""
    from jointlab.torch_compat.ops import is_collective_op

    return is_collective_op(func) or getattr(func, "namespace", None) == "_dtensor"


_MODE_CLASS: list[type] = []


def _is_plain(a: Any) -> bool:
    """A tensor of no subclass (a ``LocalTensor`` holds every rank's value already)."""
    return type(a) in (torch.Tensor, torch.nn.Parameter)


def _every_rank_mode_class() -> type:
    """``LocalTensorMode`` that runs a collective of plain tensors on every rank (built once).

    torch's mode runs a collective whose tensors are all plain once, for the process's
    own rank, and hands that one result to every rank (an ``all_to_all_single`` of a
    tensor made outside the mode gave rank 0's chunks to all ranks); one mixing plain
    tensors and ``LocalTensor`` s it refuses with an assertion. A plain tensor
    under the mode stands for the same value on every rank, so its collectives are
    run on that value replicated over the mode's ranks, each rank getting its own
    result; an in-place collective writes back into a plain tensor only a result
    that is the same on every rank, and is refused otherwise.
    """
    if _MODE_CLASS:
        return _MODE_CLASS[0]
    from jointlab.torch_compat._base import resolve

    base, local = resolve("TorchLocalTensorMode"), resolve("LocalTensor")
    pytree = resolve("pytree")

    class EveryRankMode(base):  # type: ignore[misc, valid-type]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if (self._disable or not _is_collective(func)
                    or not any(map(_is_plain, pytree.tree_leaves((args, kwargs))))):
                return super().__torch_dispatch__(func, types, args, kwargs)
            return _collective_on_every_rank(self, func, types, args, kwargs, local, pytree)

    _MODE_CLASS.append(EveryRankMode)
    return EveryRankMode


def _collective_on_every_rank(mode: Any, func: Any, types: Any, args: Any, kwargs: Any,
                              local: type, pytree: Any) -> Any:
    """Run ``func`` with each plain tensor replicated over ``mode.ranks`` (see above)."""
    lifted: dict[int, Any] = {}

    def lift(a: Any) -> Any:
        if not _is_plain(a):
            return a
        lifted[id(a)] = (a, local({r: a.detach().clone() for r in sorted(mode.ranks)}))
        return lifted[id(a)][1]

    largs, lkwargs = pytree.tree_map(lift, (args, kwargs))
    out = _base_dispatch(mode, func, types, largs, lkwargs)
    if func.namespace == "c10d" or func._schema.is_mutable:  # c10d's ops write in place
        for plain, wrapped in lifted.values():
            _write_back(func, plain, wrapped)
    return out


def _base_dispatch(mode: Any, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
    """torch's own ``LocalTensorMode.__torch_dispatch__`` (bypassing jointlab's)."""
    return super(type(mode), mode).__torch_dispatch__(func, types, args, kwargs)


def _write_back(func: Any, plain: torch.Tensor, wrapped: Any) -> None:
    """Copy an in-place collective's result into the plain tensor when every rank agrees."""
    from jointlab.errors import UnsupportedWrapperError

    values = list(per_rank_values(wrapped).values())
    if all(v.shape == plain.shape and torch.equal(v, values[0]) for v in values[1:]):
        if not torch.equal(values[0], plain):
            plain.copy_(values[0])
        return
    raise UnsupportedWrapperError(
        f"{func.name()} writes into a plain tensor (made outside world.all_ranks()) a result "
        "that differs between the simulated ranks, and a plain tensor holds one value for "
        "all ranks. Make the tensor inside `with world.all_ranks():` (so it holds every "
        "rank's value), or use the functional collective "
        "(torch.distributed._functional_collectives), whose result holds each rank's value.")


def every_rank_mode(ranks: Any) -> Any:
    """A ``LocalTensorMode`` over ``ranks`` whose collectives of plain tensors are exact.

    Args:
        ranks: The simulated ranks (an int: ``range(ranks)``; or a set of ranks).

    Returns:
        The mode (a subclass of torch's ``LocalTensorMode``).

    Raises:
        UnsupportedTorchError: This torch has no ``LocalTensorMode``.
    """
    return _every_rank_mode_class()(ranks)


#: What jointlab enters for "every rank at once" (``compat.LocalTensorMode(ranks)``): torch's
#: ``LocalTensorMode`` with exact collectives of plain tensors (:func:`every_rank_mode`).
LocalTensorMode = every_rank_mode


def every_rank_mode_active() -> bool:
    """True while a ``LocalTensorMode`` (``world.all_ranks()``, every rank at once) is entered.

    False on a torch without ``LocalTensorMode``.
    """
    try:
        from torch.distributed._local_tensor import local_tensor_mode
    except ImportError:
        return False
    return local_tensor_mode() is not None
