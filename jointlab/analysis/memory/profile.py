"""``joint.memory()``: predict one run's memory, measure it, and bind the what-if.

The top of the memory package: it imports :mod:`.predict`, :mod:`.measure` and
:mod:`.whatif`, and none of them imports it back. The profile it returns is
frozen; its :meth:`~jointlab.MemoryProfile.what_if` calls the what-if analysis
bound here, so the result module never imports the analyses that make it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from jointlab.analysis.memory.measure import measure
from jointlab.analysis.memory.predict import predict
from jointlab.analysis.memory.result import MemoryProfile
from jointlab.analysis.memory.sizes import Sizes, sizes_for
from jointlab.analysis.memory.whatif import what_if
from jointlab.errors import MemoryQueryError
from jointlab.inputs import flatten_inputs

if TYPE_CHECKING:
    from torch import nn

    from jointlab.core import TracedGraph

__all__ = ["attach_measurement", "memory_profile"]


def attach_measurement(profile: MemoryProfile, measured: pd.DataFrame) -> MemoryProfile:
    """A copy of ``profile`` with measured per-step columns and the peak error.

    Args:
        profile: A predicted profile (left unchanged).
        measured: From :func:`jointlab.analysis.memory.measure.measure`: one row per step with
            ``measured`` (graph values), ``measured_total`` and ``workspace``.

    Returns:
        The measured profile.
    """
    tl = profile.timeline.copy()
    for col in ("measured", "measured_total", "workspace"):
        tl[col] = measured[col].to_numpy()
    meas = tl["measured"].to_numpy()
    step = int(meas.argmax())
    peak = int(meas[step])
    return dataclasses.replace(
        profile, timeline=tl, measured_peak_bytes=peak,
        measured_peak_node=str(tl["node"].iloc[step]),
        measured_total_peak_bytes=int(tl["measured_total"].max()),
        workspace_peak_bytes=int(tl["workspace"].max()),
        peak_error=(profile.peak_bytes - peak) / max(peak, 1))


def memory_profile(joint: TracedGraph, model: nn.Module | None = None,
                   inputs: dict[str, Any] | None = None, device: str | None = None
                   ) -> MemoryProfile:
    """Predict, and with ``model`` and ``inputs`` also measure, one run's memory.

    Args:
        joint: The traced joint graph.
        model: Run the graph on this model to measure what is really allocated.
        inputs: Inputs for the measured run (required with ``model``). For a
            dynamic graph the prediction is made at their sizes too.
        device: Device to model and measure on; defaults to the model's (or CPU).

    Returns:
        A :class:`MemoryProfile` whose ``what_if`` scores this graph.

    Raises:
        MemoryQueryError: ``model`` is given without ``inputs`` or the reverse.
    """
    if (model is None) != (inputs is None):
        given, missing = ("model", "inputs") if inputs is None else ("inputs", "model")
        raise MemoryQueryError(
            f"joint.memory(): {given}= was given without {missing}=; pass both "
            "(joint.memory(model=model, inputs=inputs)) to measure a run, or neither to "
            "predict only.")
    if device is None:
        p = next(iter(model.parameters()), None) if model is not None else None
        device = p.device.type if p is not None else "cpu"
    name = type(model).__name__ if model is not None else ""
    prof = predict(joint, device=str(device), name=name, sizes=_call_sizes(joint, inputs))
    prof = dataclasses.replace(prof, _what_if=functools.partial(_what_if, joint))
    if model is None:
        return prof
    return attach_measurement(prof, measure(joint, model, inputs, device=str(device)))


def _what_if(joint: TracedGraph, budgets: tuple[float, ...]) -> pd.DataFrame:
    return what_if(joint, budgets=budgets)


def _call_sizes(joint: TracedGraph, inputs: dict[str, Any] | None) -> Sizes | None:
    """Sizes of a dynamic graph at ``inputs`` (None: static, or no inputs)."""
    if inputs is None or getattr(joint, "shape_guards", None) is None:
        return None
    leaves, _ = flatten_inputs(inputs)
    return sizes_for(joint, {p: v for p, v in leaves if isinstance(v, torch.Tensor)})
