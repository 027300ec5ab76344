"""The guards a trace records from what it read, and what it reports about what it wrote.

:func:`watching_python_state` wraps the mode's trace: it scans the code for
globals and closure variables (:mod:`jointlab.trace.code_reads`) and watches
the model and the objects the code names (:mod:`jointlab.trace.reads`).
Afterwards :func:`read_facts` turns the record into ``read`` and ``variable``
assumptions and :func:`warn_side_effects` names the Python attributes the step
changed.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from jointlab.assumptions import Assumption
from jointlab.errors import SideEffectWarning, user_stacklevel
from jointlab.guard_values import tensor_form
from jointlab.trace.code_reads import objects_to_watch, variables_read
from jointlab.trace.reads import ReadRecorder, recording_reads

__all__ = ["Watched", "read_facts", "warn_side_effects", "watching_python_state"]


@dataclass
class Watched:
    """The recorder of one trace (complete after the block) and its roots' live readers."""

    recorder: ReadRecorder
    readers: dict[str, Callable[[], Any]]
    train_fn: Callable[..., Any]


@contextlib.contextmanager
def watching_python_state(model: nn.Module, train_fn: Callable[..., Any]
                          ) -> Iterator[Watched]:
    """Record what the block reads and writes of Python state.

    Args:
        model: The model being traced.
        train_fn: The training step.

    Yields:
        A :class:`Watched`, complete once the block ends.
    """
    objects = objects_to_watch(model, train_fn)
    with recording_reads(model) as rec:
        for label, obj, _ in objects:
            rec.watch(obj, label)
        yield Watched(rec, {label: read for label, _, read in objects}, train_fn)


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
    reads = {**rec.reads, **{k: tensor_form(t) for k, t in rec.tensors.items()
                             if type(t) is torch.Tensor}}  # a real tensor, not a fake
    for (target, path), form in reads.items():
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
