"""Inductor's global state a compile depends on: recorded, compared, and restored.

A compiled graph is the product of Inductor's configuration and of its global
tables at the time it compiled: the lowering of each ATen op
(``torch._inductor.lowering.lowerings``) and Inductor's decompositions
(``torch._inductor.decomposition.decompositions``). A user who patches one of
them for a compile and restores it afterwards (the way a lowering bug is
injected in a notebook) holds code that a fresh compile no longer produces.
:func:`inductor_state` records those three; :func:`state_changes` says what
differs now; :func:`inductor_state_applied` compiles under a recorded state,
with every compile cache off, and puts the present state back afterwards.
Other patches (to Inductor's passes or code generators) are not recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from jointlab.torch_compat._base import torch_module

__all__ = ["InductorState", "inductor_state", "inductor_state_applied", "state_changes"]

_PURPOSE = "recompile parts of a compiled graph under the state that compiled it"
# Caches off: a cached compile would return code built under another state.
NO_CACHES = {"force_disable_caches": True, "fx_graph_cache": False}


@dataclass(frozen=True)
class InductorState:
    """Inductor's configuration, lowerings and decompositions at one moment (shallow copies)."""

    config: dict[str, Any]
    lowerings: dict[Any, Any]
    decompositions: dict[Any, Any]


def _tables() -> tuple[Any, dict[Any, Any], dict[Any, Any]]:
    config = torch_module("torch._inductor.config", _PURPOSE)
    lowering = torch_module("torch._inductor.lowering", _PURPOSE)
    decomposition = torch_module("torch._inductor.decomposition", _PURPOSE)
    return config, lowering.lowerings, decomposition.decompositions


def inductor_state() -> InductorState:
    """Record Inductor's present configuration, lowerings and decompositions.

    Returns:
        An :class:`InductorState` (the tables' entries, not copies of the functions).
    """
    config, lowerings, decompositions = _tables()
    return InductorState(dict(config.get_config_copy()), dict(lowerings), dict(decompositions))


def _differs(a: dict[Any, Any], b: dict[Any, Any]) -> list[Any]:
    out = []
    for key in a.keys() | b.keys():
        x, y = a.get(key, _MISSING), b.get(key, _MISSING)
        try:
            same = x is y or bool(x == y)
        except Exception:  # noqa: BLE001 (a config value with an odd __eq__)
            same = False
        if not same:
            out.append(key)
    return sorted(out, key=str)


_MISSING = object()


def state_changes(recorded: InductorState, now: InductorState | None = None) -> list[str]:
    """What differs between ``recorded`` and ``now`` (default: the present state), in words."""
    now = now or inductor_state()
    return ([f"config {k}" for k in _differs(recorded.config, now.config)]
            + [f"lowering of {k}" for k in _differs(recorded.lowerings, now.lowerings)]
            + [f"decomposition of {k}"
               for k in _differs(recorded.decompositions, now.decompositions)])


def _swap(table: dict[Any, Any], want: dict[Any, Any]) -> dict[Any, Any]:
    """Make ``table`` hold ``want``'s entries; return what it held before."""
    before = dict(table)
    for key in _differs(before, want):
        if key in want:
            table[key] = want[key]
        else:
            del table[key]
    return before


@contextlib.contextmanager
def inductor_state_applied(state: InductorState) -> Iterator[dict[str, Any]]:
    """Inductor's lowerings and decompositions as in ``state`` while open; then as now.

    Yields:
        Inductor options to compile with: ``state``'s configuration where it
        differs from the present one, and every cache off.
    """
    config, lowerings, decompositions = _tables()
    options = {k: state.config[k] for k in _differs(state.config, config.get_config_copy())
               if k in state.config}
    old_lowerings = _swap(lowerings, state.lowerings)
    old_decompositions = _swap(decompositions, state.decompositions)
    try:
        yield {**options, **NO_CACHES}
    finally:
        _swap(lowerings, old_lowerings)
        _swap(decompositions, old_decompositions)
