"""``jl.report``: compute what the HTML report shows, then hand it to the renderer.

The renderer (:mod:`jointlab.viz.report`) runs no analysis; this function, at
the top of the package, computes the node table, the memory profile (measured
with a model and inputs), the comparison with eager and the versions, and
passes them down.
"""

from __future__ import annotations

import datetime
import pathlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch
from torch import nn

from jointlab.analysis.compare.compare import compare
from jointlab.analysis.memory.profile import memory_profile
from jointlab.analysis.tables import node_table
from jointlab.core import TracedGraph

__all__ = ["report"]


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


def report(joint: TracedGraph, path: str | pathlib.Path, *, model: nn.Module | None = None,
           inputs: dict[str, Any] | None = None, title: str = "jointlab report",
           comparison: Any = None) -> pathlib.Path:
    """Write a self-contained HTML report of ``joint`` to ``path``.

    Args:
        joint: The traced graph.
        path: Output file; parent folders are created.
        model: With ``inputs``, also measure memory and compare with eager.
        inputs: Inputs for ``model``.
        title: Page title (escaped).
        comparison: A comparison already computed for ``model`` and ``inputs``
            (else computed here when both are given).

    Returns:
        The path written.
    """
    from jointlab.viz.report import ReportData, write_report

    live = model is not None and inputs is not None
    nodes = joint.cached("nodes", node_table)
    memory = memory_profile(joint, model, inputs) if live else memory_profile(joint)
    if live and comparison is None:  # after the measured run, as the page shows them
        comparison = compare(joint, model, inputs)
    data = ReportData(
        joint=joint, nodes=nodes, memory=memory, comparison=comparison if live else None,
        model_class=type(model).__name__ if model is not None else "",
        versions=(("jointlab", _version("jointlab")), ("torch", torch.__version__)))
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return write_report(data, path, title=title, date=date)
