"""One fact a joint graph was traced under: the record that guards are made of.

:class:`Assumption` is plain data (saved with the graph, shown in
``joint.guards``); :mod:`jointlab.assumptions` records and checks them,
:mod:`jointlab.live_state` reads each one again on the live model, and
:mod:`jointlab.guard_text` puts a difference into words.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["KINDS", "Assumption"]

KINDS = ("training", "requires_grad", "class", "hooks", "read", "variable", "hyperparameter",
         "global", "rank")


@dataclass(frozen=True)
class Assumption:
    """One fact the graph was traced under.

    Attributes:
        kind: One of :data:`KINDS`: ``"training"``, ``"requires_grad"``, ``"class"``,
            ``"hooks"``, ``"read"``, ``"variable"``, ``"global"``, ``"rank"`` (and
            ``"hyperparameter"`` in older archives).
        target: The module FQN (``"<the model>"`` for the root), parameter FQN, the root
            of a read (``"train_fn: crit"``, ``"global CFG"``), a variable's scope
            (``"train_fn"``, ``"mymodule globals"``), setting, or the rank read.
        attr: The attribute, dotted path (``"config.hidden_dropout"``), variable or
            setting name (``"training"``, ``"p"``, ``"autocast[cpu]"``, ``"rank"``).
        value: The value at trace time (plain Python data).
        source: Where it came from (``"model at jl.trace"``, ``"torch at jl.trace"``, the
            user's line of a rank read).
        ranks: For a ``rank`` fact, the world ranks that read ``value`` there (the ranks
            the graph may run as); None for the other kinds.
        reader: For a ``variable`` fact (or a ``read`` rooted at one), fetches the live
            root; not saved, so a loaded graph cannot check those (its table says so).
    """

    kind: str
    target: str
    attr: str
    value: Any
    source: str
    ranks: tuple[int, ...] | None = None
    reader: Callable[[], Any] | None = field(default=None, compare=False, repr=False)
