"""Refuse ``torch.cond`` on a tensor predicate while ``train_fn`` is traced.

``torch.cond(pred, true_fn, false_fn, operands)`` picks its branch from a
tensor's value when the step runs. Eager runs it through a ``torch.compile``
of the ``cond`` higher-order op; under jl.trace that compile meets the trace's
own modes and fails deep inside torch, in torch's internal words (make_fx mode:
no rule for ``HigherOrderOperator cond`` in the fake mode; AOT mode: the same
for jointlab's parameter-write check). A joint graph is one flat list of ATen
ops with their backward and cannot hold a data-dependent branch.
:func:`cond_refusals` replaces ``torch.cond`` while ``train_fn`` runs, for every
caller, and raises :class:`~jointlab.errors.UnsupportedControlFlowError` with
the user's line and the two ways to write it that trace exactly. A plain Python
predicate (``bool``/``int``/``float``) is let through: ``torch.cond`` then just
calls one branch, as eager does, and the trace records that branch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from jointlab.errors import JointlabError, UnsupportedControlFlowError
from jointlab.trace.user_calls import CallSite, refuse_calls

__all__ = ["CONTROL_FLOW_CALLS", "cond_refusals"]

#: The control-flow entry points refused (where this torch has them).
CONTROL_FLOW_CALLS: tuple[tuple[Any, str], ...] = ((torch, "cond"),)


def _refusal(_module: Any, name: str, site: CallSite, _original: Callable[..., Any],
             args: tuple, kwargs: dict) -> tuple[type[JointlabError], str] | None:
    pred = args[0] if args else kwargs.get("pred")
    if isinstance(pred, (bool, int, float)):
        return None  # eager calls one branch; so does the trace
    how = f"at {site.line}" if site.by_user else (
        f"through {site.function} (at {site.line}), reached from your line {site.user_line}")
    return UnsupportedControlFlowError, (
        f"train_fn calls torch.{name}() {how} with a tensor predicate. torch.cond is "
        "higher-order control flow: which branch runs depends on a tensor's value when the "
        "step runs, and a joint graph (one list of ATen ops and their backward) cannot hold "
        "that branch, so jl.trace does not trace it (in either mode). Compute both branches "
        "and select: out = torch.where(pred, true_fn(x), false_fn(x)) (exact, gradients "
        "flow through the branch selected); or, when the choice is known before the step, "
        "branch in Python on a plain value passed in inputs ({'x': x, 'use_a': True} and "
        "`if use_a:` in train_fn): the graph holds the branch taken and refuses a run with "
        "another value, so trace once per value.")


@contextlib.contextmanager
def cond_refusals() -> Iterator[None]:
    """Refuse ``torch.cond`` on a tensor predicate inside this block, whoever calls it.

    Yields:
        Nothing; ``torch.cond`` is back when the block exits, whatever happens.
    """
    with refuse_calls(CONTROL_FLOW_CALLS, _refusal):
        yield
