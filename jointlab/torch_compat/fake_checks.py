"""A fake mode that shows each ATen op to a check first: one Python dispatch layer, not two.

jl.trace refuses in-place writes into parameters while ``train_fn`` runs
(:func:`jointlab.trace.refusals.in_train_fn`). A ``TorchDispatchMode`` of its
own on top of make_fx's modes would see every op, at the cost of one more
Python dispatch round trip per op (about 8 % of a trace). In make_fx mode
jointlab makes the ``FakeTensorMode`` the trace runs on, and every op reaches
it (make_fx's proxy mode computes each op's value by calling it on the fakes),
so the check runs there instead: :func:`checking_fake_mode` builds a
``FakeTensorMode`` whose ``__torch_dispatch__`` (the documented mode protocol)
calls :func:`fake_mode_check`'s check before handing the op to torch.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from jointlab.torch_compat._base import resolve

__all__ = ["checking_fake_mode", "fake_mode_check", "runs_checks"]

#: Called with ``(func, args, kwargs)`` before the fake mode runs an ATen op.
Check = Callable[[Any, tuple, dict], None]


@functools.cache
def _checking_class() -> type:
    base = resolve("FakeTensorMode")

    class CheckingFakeTensorMode(base):  # type: ignore[misc,valid-type]
        """``FakeTensorMode`` that calls ``self.op_check`` (when set) before each op."""

        op_check: Check | None = None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            check = self.op_check
            if check is not None:
                check(func, args, kwargs or {})
            return super().__torch_dispatch__(func, types, args, kwargs)

    return CheckingFakeTensorMode


def checking_fake_mode(**kwargs: Any) -> Any:
    """A ``FakeTensorMode(**kwargs)`` that can run a check before each op it handles.

    Args:
        **kwargs: ``FakeTensorMode``'s arguments.

    Returns:
        The mode; no check runs until :func:`fake_mode_check` sets one.

    Raises:
        UnsupportedTorchError: This torch has no ``FakeTensorMode``.
    """
    return _checking_class()(**kwargs)


def runs_checks(mode: Any) -> bool:
    """Whether ``mode`` is a :func:`checking_fake_mode`."""
    return mode is not None and isinstance(mode, _checking_class())


@contextlib.contextmanager
def fake_mode_check(mode: Any, check: Check) -> Iterator[None]:
    """Have the checking fake ``mode`` call ``check`` before each op, inside this block.

    Args:
        mode: A :func:`checking_fake_mode`.
        check: Raises to refuse an op, before it runs.

    Yields:
        Nothing; the previous check (usually none) is back on exit.
    """
    prev = mode.op_check
    mode.op_check = check
    try:
        yield
    finally:
        mode.op_check = prev
