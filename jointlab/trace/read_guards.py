"""The guards a trace records from what it read, and what it reports about what it wrote.

:func:`watching_python_state` wraps the mode's trace: it scans the code for
globals and closure variables (:mod:`jointlab.trace.code_reads`), watches the
model and the objects the code names (:mod:`jointlab.trace.reads`), and
refuses a step that drew from Python's or numpy's global generator (the draw
would be baked; eager draws anew each step). Afterwards :func:`read_facts`
turns the record into ``read`` and ``variable`` assumptions and
:func:`warn_side_effects` names the Python attributes the step changed.
"""

from __future__ import annotations

import contextlib
import random
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch import nn

from jointlab.assumptions import Assumption
from jointlab.errors import SideEffectWarning, UnsupportedRandomOpError, user_stacklevel
from jointlab.trace.code_reads import objects_to_watch, variables_read
from jointlab.trace.reads import ReadRecorder, recording_reads

__all__ = ["Watched", "read_facts", "warn_side_effects", "watching_python_state"]


@dataclass
class Watched:
    """The recorder of one trace (complete after the block) and its roots' live readers."""

    recorder: ReadRecorder
    readers: dict[str, Callable[[], Any]]
    train_fn: Callable[..., Any]


def _rng_states() -> tuple[Any, Any]:
    np = sys.modules.get("numpy")
    return random.getstate(), (np.random.get_state() if np is not None else None)


def _drawn(before: tuple[Any, Any], after: tuple[Any, Any]) -> list[str]:
    out = ["Python's random module"] if before[0] != after[0] else []
    b, a = before[1], after[1]
    if b is not None and a is not None and (b[2:] != a[2:] or (b[1] != a[1]).any()):
        out.append("numpy.random")
    return out


def _refuse_python_draws(before: tuple[Any, Any]) -> None:
    drawn = _drawn(before, _rng_states())
    if drawn:
        raise UnsupportedRandomOpError(
            f"the traced step drew from {' and '.join(drawn)} while traced (a layerdrop "
            "`random.random() < p`, a numpy mask...). The graph would keep that one draw "
            "for ever, while eager draws anew every step. Draw with torch (torch.rand, "
            "torch.bernoulli: the graph draws those each run), or draw outside train_fn "
            "and pass the result in as an input.")


@contextlib.contextmanager
def watching_python_state(model: nn.Module, train_fn: Callable[..., Any]
                          ) -> Iterator[Watched]:
    """Record what the block reads and writes of Python state; refuse Python RNG draws.

    Args:
        model: The model being traced.
        train_fn: The training step.

    Yields:
        A :class:`Watched`, complete once the block ends.

    Raises:
        jointlab.errors.UnsupportedRandomOpError: The block drew from ``random`` or
            ``numpy.random`` (checked when it ended without an error).
    """
    objects = objects_to_watch(model, train_fn)
    before = _rng_states()
    with recording_reads(model) as rec:
        for label, obj, _ in objects:
            rec.watch(obj, label)
        yield Watched(rec, {label: read for label, _, read in objects}, train_fn)
    _refuse_python_draws(before)


def read_facts(watched: Watched) -> list[Assumption]:
    """The ``variable`` and ``read`` assumptions of one trace, in the order found.

    Args:
        watched: What :func:`watching_python_state` recorded.

    Returns:
        One fact per plain global or closure variable the code names, and one per
        attribute path the step read (and did not write itself).
    """
    out = [Assumption("variable", v.target, v.name, v.value, v.source, reader=v.read)
           for v in variables_read(watched.recorder.codes, watched.train_fn)]
    rec = watched.recorder
    for (target, path), form in rec.reads.items():
        out.append(Assumption("read", target, path, form, rec.sources[(target, path)],
                              reader=watched.readers.get(target)))
    return out


def warn_side_effects(watched: Watched) -> None:
    """Warn once, naming each Python attribute the traced step changed (tracing restored it).

    Args:
        watched: What :func:`watching_python_state` recorded.
    """
    effects = watched.recorder.side_effects
    if not effects:
        return
    shown = "; ".join(f"'{e.target}'.{e.path} ({e.before} -> {e.after}, at {e.source})"
                      for e in effects[:5])
    more = f" and {len(effects) - 5} more" if len(effects) > 5 else ""
    warnings.warn(
        f"the traced step changes Python state that the graph does not change: {shown}{more}. "
        "jl.trace put it back; joint.run leaves it as it is, where each eager step changes it. "
        "jointlab cannot tell whether the step's math depends on it: if it does (a step "
        "counter that picks a branch), the graph computes the traced step every time; pass "
        "such a value to train_fn as an input instead.",
        SideEffectWarning, stacklevel=user_stacklevel())
