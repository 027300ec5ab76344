"""The frozen result of a memory analysis: :class:`MemoryProfile` and its categories.

This module sits below every other memory module: :mod:`.predict` builds a
profile, :mod:`.measure` supplies the measured columns, :mod:`.whatif` scores
partitions and :mod:`.profile` (``joint.memory()``) ties them together. It
imports none of them, so a profile can hand off to the what-if analysis (a
callable bound when the profile is made) and to its notebook card in
:mod:`jointlab.viz.cards` without an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from jointlab.display import rich_html
from jointlab.errors import WhatIfError
from jointlab.units import human_bytes

CATEGORIES = ("param", "buffer", "input", "activation", "temporary", "gradient", "output")

WhatIf = Callable[[tuple[float, ...]], pd.DataFrame]


@dataclass(frozen=True, eq=False)
class MemoryProfile:
    """Predicted (and optionally measured) memory of one ``joint.run``.

    Attributes:
        lifetimes: One row per storage: owner node, op, module, category,
            first/last step, bytes, shape, dtype, number of aliases, and
            ``filled_by``: the in-place op that first writes a storage allocated
            uninitialised (``aten.bernoulli_`` for a dropout mask), else "".
        timeline: One row per node step: node, op, module, phase, shape, live
            bytes per category, ``total``; with ``measured``, ``measured_total``
            and ``workspace`` columns when measured.
        peak_bytes: Predicted peak of live bytes (state and inputs included).
        peak_node: Node at which the predicted peak occurs.
        forward_peak_bytes: Predicted peak over forward steps.
        backward_peak_bytes: Predicted peak over backward steps.
        boundary_step: First backward step (``len(timeline)`` if none).
        device: Device the prediction models (allocator rounding).
        measured_peak_bytes: Measured peak of graph values (kernel workspace excluded).
        measured_peak_node: Node at which the measured peak occurs.
        measured_total_peak_bytes: Measured peak including workspace.
        workspace_peak_bytes: Largest workspace seen at one step.
        peak_error: ``(predicted - measured) / measured`` of the peak.
        name: Label used in the HTML card (e.g. the model's class).
        input_sizes: The tensor input sizes the prediction is for, by dotted
            path: the traced sizes, or for a dynamic graph those of the
            ``inputs`` given to ``joint.memory``.
    """

    lifetimes: pd.DataFrame
    timeline: pd.DataFrame
    peak_bytes: int
    peak_node: str
    forward_peak_bytes: int
    backward_peak_bytes: int
    boundary_step: int
    device: str = "cpu"
    measured_peak_bytes: int | None = None
    measured_peak_node: str | None = None
    measured_total_peak_bytes: int | None = None
    workspace_peak_bytes: int | None = None
    peak_error: float | None = None
    name: str = ""
    input_sizes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    _what_if: WhatIf | None = field(default=None, repr=False)

    @property
    def measured(self) -> bool:
        """True when the profile holds a measured run."""
        return self.measured_peak_bytes is not None

    @property
    def saved_bytes(self) -> int:
        """Bytes of the forward values kept alive for the backward (activations)."""
        life = self.lifetimes
        return int(life.loc[life["category"] == "activation", "bytes"].sum())

    def by_category(self, step: int | None = None) -> pd.Series:
        """Live bytes per category at ``step`` (default: the predicted peak).

        Args:
            step: A node step.

        Returns:
            Bytes indexed by category.
        """
        tl = self.timeline
        step = int(tl["total"].to_numpy().argmax()) if step is None else step
        return tl.loc[step, list(CATEGORIES)].astype("int64")

    def what_if(self, budgets: tuple[float, ...] = (1.0, 0.5, 0.2)) -> pd.DataFrame:
        """Saved activations and peak under PyTorch's partitioners.

        See :func:`jointlab.analysis.memory.whatif.what_if`.

        Args:
            budgets: Activation-memory budgets for min-cut rematerialisation.

        Returns:
            One row per option.

        Raises:
            WhatIfError: The profile was predicted for a bare graph module,
                not made by ``joint.memory()``, so there is no joint graph to split.
        """
        if self._what_if is None:
            raise WhatIfError(
                "what_if: this profile was predicted for a bare graph module, not by "
                "joint.memory(); call joint.memory().what_if() on the traced JointGraph.")
        return self._what_if(tuple(budgets))

    def __repr__(self) -> str:
        measured = (f", measured peak {human_bytes(self.measured_peak_bytes)}"
                    if self.measured_peak_bytes is not None else "")
        return (f"<MemoryProfile peak {human_bytes(self.peak_bytes)} at {self.peak_node!r}, "
                f"saved {human_bytes(self.saved_bytes)}, {len(self.timeline)} nodes"
                f"{measured}, {self.device}>")

    def _repr_html_(self) -> str:
        return rich_html("memory", self)
