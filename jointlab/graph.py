"""``JointGraph``: the notebook front door over the plain traced graph, and ``jl.load``.

:class:`jointlab.runtime.graph.RunnableGraph` is what tracing and loading
produce and what every layer reads: the graph module, its layout, ``run``.
:class:`JointGraph` is that object with the notebook conveniences on top
(``joint.nodes``, ``summary``, ``select``, ``memory()``, ``compile()``,
``save()``, the card in a notebook), each a one-line hand-off to the module
that does the work. This module sits at the top of the package, above every
reader it hands off to, so those imports point down; nothing inside the
package imports it, and it imports no tracer: ``jl.load`` is here,
``jl.trace`` and ``jl.trace_ranks`` are in :mod:`jointlab.tracing`, and both
wrap the plain graph with :meth:`JointGraph.of`. ``jl.gather_ranks`` loads the
graphs every process of a real job traced, on one rank.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from torch import nn

from jointlab.display import rich_html
from jointlab.errors import TableQueryError
from jointlab.passes.analyze import mark_analyzed, mark_saved_for_backward, recount_flops
from jointlab.passes.pipeline import reanalyze
from jointlab.runtime.graph import RunnableGraph
from jointlab.runtime.rank_view import RankGraphs

if TYPE_CHECKING:
    import pandas as pd

    from jointlab.analysis.modules import ModuleTable
    from jointlab.analysis.record import Record
    from jointlab.core import GraphParts, TracedGraph

__all__ = ["JointGraph", "gather_ranks", "load"]


class JointGraph(RunnableGraph):
    """One FX graph holding forward, loss and backward of a training step.

    A :class:`~jointlab.runtime.graph.RunnableGraph` (layout, ``run``,
    descriptor-style queries) with the notebook's conveniences: the node table,
    summaries, memory, compiling and saving, each handed to its own module.
    """

    @classmethod
    def of(cls, graph: RunnableGraph) -> JointGraph:
        """The JointGraph over ``graph`` (the same graph module, layout and cache).

        Args:
            graph: A plain traced graph (as :mod:`jointlab.trace` or :mod:`jointlab.io` build).

        Returns:
            ``graph`` itself when it already is a JointGraph, else a JointGraph sharing its state.
        """
        if isinstance(graph, cls):
            return graph
        joint = cls.__new__(cls)
        joint.__dict__.update(vars(graph))
        return joint

    def recompute(self) -> None:
        """Refresh the per-node analysis after editing the graph (or its node meta).

        Recompiles the graph module, so it runs the edited graph, drops cached
        tables and profiles, and reruns the cost-and-storage pass
        (:func:`jointlab.passes.pipeline.reanalyze`). Readers (``nodes``,
        ``memory()``, plots, ``save``) refuse an edited graph with
        :class:`jointlab.errors.StaleAnalysisError` until this is called. The
        trace-time annotations (phase, module, source) are kept: give a node
        you insert its own ``node.meta["jointlab"]``.
        """
        super().recompute()
        reanalyze(self.graph_module)

    @property
    def nodes(self) -> pd.DataFrame:
        """One row per graph node, indexed by node name (see :mod:`jointlab.analysis.tables`)."""
        from jointlab.analysis.tables import node_table

        return self.cached("nodes", node_table)

    def summary(self, by: str = "module", depth: int | None = None, *,
                model: nn.Module | None = None, inputs: dict[str, Any] | None = None,
                record: Record | None = None) -> pd.DataFrame | ModuleTable:
        """Aggregate the node table by ``"module"``, ``"phase"`` or ``"op"``.

        Args:
            by: Grouping key.
            depth: For ``by="module"``, truncate module FQNs to this many components.
            model: For ``by="module"``: the traced model. Given, the summary is
                :func:`jointlab.module_summary`'s, one row per module of the model
                (parameters with tied weights once, shapes, FLOPs, bytes, times).
            inputs: With ``model``: example inputs, for the modules' input shapes.
            record: With ``model``: a :func:`jointlab.record` of this graph, for times.

        Returns:
            Counts, FLOPs, bytes and saved bytes per group, forward and backward side
            by side (a DataFrame). With ``model``: a
            :class:`jointlab.analysis.modules.ModuleTable`, the styled table in a notebook,
            its DataFrame in ``.data``.

        Raises:
            TableQueryError: ``model`` with ``by`` other than ``"module"``, or
                ``inputs``/``record`` without ``model``.
        """
        if model is None:
            if inputs is not None or record is not None:
                raise TableQueryError("inputs= and record= describe the model's modules: "
                                      "pass model= too (joint.summary(by='module', model=m))")
            from jointlab.analysis.tables import summary

            return summary(self, by=by, depth=depth)
        if by != "module":
            raise TableQueryError(f"model= is for by='module' (per-module parameters, shapes "
                                  f"and times), not by={by!r}")
        from jointlab.analysis.modules import ModuleTable, module_summary

        return ModuleTable(module_summary(self, model, inputs, record=record, depth=depth))

    def select(self, *, module: str | None = None, phase: str | None = None,
               op: str | None = None) -> pd.DataFrame:
        """Return the rows of :attr:`nodes` matching a module prefix, phase and/or op.

        Args:
            module: Module FQN prefix (backward rows of that module included).
            phase: One of the phases in :data:`jointlab.meta.PHASES`.
            op: Target name, e.g. ``"aten.mm"``.

        Returns:
            A filtered view of the node table.
        """
        from jointlab.analysis.tables import select

        return select(self, module=module, phase=phase, op=op)

    def _repr_html_(self) -> str:
        return rich_html("graph", self)

    def memory(self, model: nn.Module | None = None, inputs: dict[str, Any] | None = None,
               *, device: str | None = None) -> Any:
        """Predict (and, given a model and inputs, measure) memory of one :meth:`run`.

        Args:
            model: Run the graph on this model to measure real allocations.
            inputs: Inputs for the measured run; a dynamic graph is also
                predicted at their sizes (``profile.input_sizes`` says which).
            device: Device for the measured run; defaults to the model's.

        Returns:
            A :class:`jointlab.MemoryProfile`.
        """
        from jointlab.analysis.memory.profile import memory_profile

        return memory_profile(self, model=model, inputs=inputs, device=device)

    def compile(self, backend: str = "inductor") -> Any:
        """Compile the joint graph with ``torch.compile`` (:mod:`jointlab.analysis.compile`).

        Args:
            backend: A ``torch.compile`` backend name.

        Returns:
            A JointGraph-like object whose ``run`` uses the compiled graph.
        """
        from jointlab.analysis.compile import compile_joint

        return compile_joint(self, backend=backend)

    def save(self, path: str) -> None:
        """Write the graph, its annotations and its layout to ``path`` (no pickle).

        Args:
            path: Destination file.
        """
        from jointlab.io.persist import save

        save(self, path)


def load(path: str) -> JointGraph:
    """Read a JointGraph written by :meth:`JointGraph.save`.

    Args:
        path: The archive.

    Returns:
        A JointGraph that runs exactly like the saved one; its archived
        analysis is current, FLOPs recounted by this torch's formulas
        (``train_fn`` is None, so ``jl.compare`` needs it passed).

    Raises:
        jointlab.errors.PersistError: The file is not a jointlab archive, or
            holds anything outside the allow-lists (rejected before any code could run).
    """
    from jointlab.io.persist import read

    return _loaded(read(path))


def _loaded(parts: GraphParts) -> JointGraph:
    """The JointGraph of an archive's parts, its analysis brought up to date."""
    from jointlab.io.persist import ARCHIVE_VERSION_KEY, CURRENT_ANALYSIS_SINCE

    if parts.graph_module.meta.get(ARCHIVE_VERSION_KEY, 0) < CURRENT_ANALYSIS_SINCE:
        mark_saved_for_backward(parts.graph_module)  # saved by the older per-node rule
    recount_flops(parts.graph_module)  # the saving torch may have lacked a formula
    mark_analyzed(parts.graph_module)  # the archive carries the analysis keys of its graph
    return JointGraph.from_parts(parts)


def gather_ranks(joint: TracedGraph, dst: int = 0, group: Any = None) -> RankGraphs | None:
    """Every rank's graph of a real distributed job, on one rank, as ``jl.trace_ranks`` gives.

    Call it in every process of the job (``torchrun``; gloo on CPU, NCCL on GPU)
    after ``jl.trace``. Each rank's graph travels as the pickle-free archive
    ``joint.save`` writes. Ranks share a class only where their archives are
    identical, guards included: a rank whose trace read its own mesh coordinate
    (``mesh._rank``) is a class of its own even where ``jl.trace_ranks`` groups it
    with others, so the classes may be finer than the fake world's, never coarser.

    Args:
        joint: This rank's traced graph.
        dst: The world rank that receives them (default 0).
        group: The process group (default: the world).

    Returns:
        On ``dst``, a :class:`RankGraphs` (each rank's loaded graph, every view
        works on it; running rank ``r``'s graph needs rank ``r``'s world); None on
        every other rank.

    Raises:
        StateMismatchError: No process group is initialised.
        PersistError: A rank's graph cannot be saved (every rank raises, none hangs).
    """
    import hashlib
    import zipfile

    from jointlab.io.gather import gather_archives
    from jointlab.io.persist import read

    archives = gather_archives(joint, dst, group)
    if archives is None:
        return None
    classes: dict[str, list[int]] = {}
    for rank, data in enumerate(archives):  # the content, not the zip's own timestamps
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            key = hashlib.sha256(b"".join(zf.read(n) for n in sorted(zf.namelist()))).hexdigest()
        classes.setdefault(key, []).append(rank)
    graphs = {tuple(ranks): _loaded(read(archives[ranks[0]])) for ranks in classes.values()}
    return RankGraphs(graphs, len(archives))
