"""jointlab: see and debug PyTorch's joint forward+backward graph.

This module only re-exports the public API. Names that need plotly or
ipywidgets (``plot_dag``, ``plot_memory``, ``explore``, ``report``) are
resolved on first use, so ``import jointlab`` stays light. Importing it warns
once when torch is outside the tested versions (see ``jointlab.torch_compat``).

``jointlab.trace`` is the function: it deliberately shadows the
``jointlab.trace`` subpackage as an attribute (the subpackage stays importable
as ``jointlab.trace.tracer`` and friends).
"""

from __future__ import annotations

from jointlab import errors as errors
from jointlab import plugins as _plugins  # noqa: F401 (registers the built-in plug-ins)
from jointlab import renderers as _renderers  # noqa: F401 (registers the renderers)
from jointlab._lazy import lazy_getattr
from jointlab.core import RunResult as RunResult
from jointlab.torch_compat import unsupported, warn_if_untested

try:
    from jointlab.graph import JointGraph as JointGraph
    from jointlab.tracing import trace as trace
except ImportError as exc:  # a torch without one of the private modules jointlab imports
    if not (exc.name or "").startswith("torch"):
        raise
    raise unsupported(f"{exc.name} (or a name in it)", "trace a training step") from exc

warn_if_untested()

_LAZY = {
    "Stepper": "jointlab.analysis.step.stepper",
    "Breakpoint": "jointlab.analysis.step.breakpoints",
    "compare": "jointlab.analysis.compare.compare",
    "Comparison": "jointlab.analysis.compare.result",
    "Divergence": "jointlab.analysis.compare.result",
    "CompiledJoint": "jointlab.analysis.compile",
    "bisect": "jointlab.analysis.bisect",
    "Bisection": "jointlab.analysis.bisect",
    "MemoryProfile": "jointlab.analysis.memory.result",
    "load": "jointlab.graph",
    "plot_dag": "jointlab.viz",
    "dag_view": "jointlab.viz",
    "plot_memory": "jointlab.viz",
    "plot_lifetimes": "jointlab.viz",
    "plot_diff": "jointlab.viz",
    "diff_view": "jointlab.viz",
    "export_figure": "jointlab.viz",
    "explore": "jointlab.widgets",
    "report": "jointlab.reporting",
    "record": "jointlab.analysis.record",
    "Record": "jointlab.analysis.record",
    "module_summary": "jointlab.analysis.modules",
    "fake_cpu": "jointlab.runtime.fakes",
    "fake_world": "jointlab.trace.fake_world",
    "run_all_ranks": "jointlab.analysis.distributed",
    "track_fsdp_step": "jointlab.analysis.memory.fsdp_check",
    "fsdp_memory_check": "jointlab.analysis.memory.fsdp_check",
    "trace_ranks": "jointlab.tracing",
    "gather_ranks": "jointlab.graph",
    "rank_table": "jointlab.analysis.rank_table",
    "RankGraphs": "jointlab.runtime.rank_view",
    "diff": "jointlab.analysis.diff",
    "GraphDiff": "jointlab.analysis.diff",
}

__all__ = ["JointGraph", "RunResult", "errors", "trace", *_LAZY]


__getattr__ = lazy_getattr(__name__, globals(), _LAZY)


def __dir__() -> list[str]:
    """The public API, lazy names included (tab completion offers them), nothing else."""
    return sorted(__all__)
