"""``jl.record``: one real step of a joint graph, with statistics of every value it makes.

:func:`record` runs the joint graph once on the live model, like
``joint.run``, through a copy of the graph with an observer call after every
node. The observer keeps, per node, the value's shape and dtype, its mean,
population standard deviation (``correction=0``), min, max, L2 norm, the
number of NaN and Inf elements, the wall time of the node, and optionally the
value itself within a byte budget. The user's graph and model are not edited
(buffers update exactly as ``joint.run`` updates them).

Statistics describe the value right after its node ran (a later in-place op
does not change them). When a value holds NaN or Inf, mean/std/min/max/norm
are over its finite elements. A value jointlab cannot describe says why in
``note`` and has NaN statistics: ``uninitialized`` (``empty*`` ops: whatever
memory held), ``complex``, ``sparse``/``quantized`` layouts, ``empty``
(no elements) and ``not a tensor``. :meth:`Record.layers` gives the norms and
NaN/Inf counts as :func:`jointlab.dag_view` colourings.

An additive attention mask holds ``-inf`` by design. A value is marked as a
mask (``mask`` column) when its node fills with ``-inf`` (``scalar_tensor``,
``full``, ``masked_fill``, ``where`` selecting a ``-inf`` fill...) or carries
such a value over unchanged (views, ``expand``, ``slice``, ``cat``...), and
every non-finite element of its value is exactly ``-inf``. Its ``inf`` count
stays in the table, but the repr's "with NaN/Inf" count and the ``nan/inf``
layer leave it out. A NaN or ``+inf`` anywhere, or ``-inf`` produced by
arithmetic (scores + mask), is counted. See ``attention_masks.mask_nodes``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
import torch.fx as fx

from jointlab.analysis.observer import ObservedStep, ValueObserver, instrument
from jointlab.analysis.tables import HumanFrame
from jointlab.analysis.value_stats import STAT_COLUMNS
from jointlab.errors import RecordError, ValueNotAvailableError
from jointlab.meta import in_module, module_label, node_error, node_info
from jointlab.units import human_bytes

if TYPE_CHECKING:
    from collections.abc import Mapping

    from torch import nn

    from jointlab.core import TracedGraph

__all__ = ["STAT_COLUMNS", "Record", "record"]


@dataclass(frozen=True, eq=False, repr=False)
class Record:
    """What one recorded step kept.

    Every statistic is computed during the step (the values are gone after
    it); :attr:`table` lays them out as a DataFrame when first read.

    Attributes:
        observed: The step's observations (:class:`~jointlab.analysis.observer.ObservedStep`),
            which :attr:`table` lays out.
        loss: The step's loss.
        param_grad_norms: L2 norm of each trainable parameter's gradient, by FQN.
        values: The kept values (clones), by node name, in graph order.
        gradients: The nodes whose value is a gradient, by node name: what of
            (``"h.0.attn.qkv.weight"`` for a parameter's gradient output,
            ``"output of h.0.mlp"`` for the gradient reaching a module's output,
            ``"input x"`` for the gradient of an input traced with requires_grad).
        input_grad_norms: L2 norm of the gradient of each input traced with
            ``requires_grad=True``, by input path (empty when none is).
    """

    observed: ObservedStep
    loss: float
    param_grad_norms: Mapping[str, float]
    values: Mapping[str, torch.Tensor]
    gradients: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    input_grad_norms: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    @functools.cached_property
    def table(self) -> pd.DataFrame:
        """One row per graph node, indexed like ``joint.nodes``, columns :data:`STAT_COLUMNS`.

        Join it with the node table as ``joint.nodes.join(rec.table)``. ``time_s``
        is the node's wall time; ``kept`` whether :meth:`value` has it; ``mask``
        whether the value is an attention mask whose ``inf`` count is its
        ``-inf`` fill (not a numerical problem: see the module docstring).
        Built on first read, then the same frame.
        """
        return _table(self.observed)

    def value(self, node: str) -> torch.Tensor:
        """The kept value of ``node`` (a clone taken right after it ran).

        Args:
            node: A node name.

        Returns:
            The tensor.

        Raises:
            ValueNotAvailableError: The node is unknown or its value was not kept.
        """
        if node not in self.observed.index:
            raise ValueNotAvailableError(f"no node named {node!r} in this record")
        if node not in self.values:
            raise ValueNotAvailableError(
                f"the value of {node!r} was not kept: record with a larger keep_bytes= "
                f"(kept {len(self.values)} values, {human_bytes(self._kept_bytes())})")
        return self.values[node]

    def grad_norm(self, depth: int | None = None) -> pd.DataFrame:
        """Gradient norm per module: the L2 norm over its own parameters' gradients.

        Args:
            depth: Group modules by their first ``depth`` FQN components (so
                ``h.0`` covers ``h.0.attn``); None groups by each parameter's owner.

        Returns:
            Indexed by module in parameter order: ``params`` (tensor count) and ``grad_norm``.
        """
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)
                                  or depth < 0):
            raise RecordError(f"depth must be a non-negative int or None, got {depth!r}")
        sq: dict[str, list[float]] = {}
        for fqn, norm in self.param_grad_norms.items():
            owner = fqn.rpartition(".")[0]
            key = owner if depth is None else ".".join(owner.split(".")[:depth])
            sq.setdefault(key, []).append(norm * norm)
        out = pd.DataFrame({"params": [len(v) for v in sq.values()],
                            "grad_norm": [math.sqrt(sum(v)) for v in sq.values()]},
                           index=pd.Index(list(sq), name="module"))
        return out

    def layers(self) -> dict[str, dict[str, float]]:
        """The recorded statistics as colour layers for :func:`jointlab.dag_view`.

        ``jl.dag_view(joint, layers=rec.layers(), color_by="grad norm")`` colours
        each node by its value; a collapsed module shows the largest value of the
        nodes under it in each band, so its backward band shows the largest
        gradient its backward computed.

        Returns:
            ``{"grad norm": ..., "value norm": ..., "nan/inf": ...}``, each
            ``{node name: number}``:

            - ``value norm``: the L2 norm of every value with statistics that is
              all finite;
            - ``grad norm``: the same for the nodes in :attr:`gradients` only
              (parameter gradients, or their alias terms, and the gradients of
              module outputs);
            - ``nan/inf``: the number of NaN and Inf elements of every value with
              statistics (0 when all finite).

            A value holding NaN or Inf has no norm here (its finite part's norm
            would look like a real one): it is left out of both norm layers,
            drawn as unknown, and counted in ``nan/inf``.
        """
        t = self.table
        described = t[t["note"].eq("")]
        bad = (described["nan"].fillna(0) + described["inf"].fillna(0)).astype("int64")
        finite = described.index[bad.eq(0).to_numpy()]
        norms = {str(n): float(v) for n, v in described.loc[finite, "norm"].items()
                 if math.isfinite(v)}
        problems = bad.where(~described["mask"].to_numpy(), 0)  # a mask's -inf is no problem
        return {"grad norm": {n: norms[n] for n in self.gradients if n in norms},
                "value norm": norms,
                "nan/inf": {str(n): int(v) for n, v in problems.items()}}

    def module_time(self, nodes: pd.DataFrame, prefix: str) -> tuple[float, float]:
        """Forward and backward seconds of the nodes at or below module ``prefix``.

        Args:
            nodes: ``joint.nodes`` of the recorded graph (its ``module`` and ``phase``).
            prefix: A module FQN.

        Returns:
            ``(forward seconds, backward seconds)``.
        """
        mods = nodes["module"]
        mask = mods.map(lambda m: in_module(m, prefix)).astype(bool)
        times = self.table["time_s"][mask]
        phase = nodes["phase"][mask]
        return float(times[phase == "forward"].sum()), float(times[phase == "backward"].sum())

    def _kept_bytes(self) -> int:
        return sum(v.nbytes for v in self.values.values())

    def __repr__(self) -> str:
        rows, _ = self.observed.finished
        described = bad = masks = 0
        for row, mask in zip(rows, self.observed.mask):
            if row[-1] == "":
                described += 1
                if row[7] or row[8]:
                    masks += mask
                    bad += not mask
        mask_note = f" ({masks} attention masks with -inf, not counted)" if masks else ""
        return (f"Record(loss={self.loss:.6g}, {len(rows)} nodes, {described} described, "
                f"{bad} with NaN/Inf{mask_note}, kept {len(self.values)} values "
                f"({human_bytes(self._kept_bytes())}))")


def _table(step: ObservedStep) -> pd.DataFrame:
    """The record's table: one row per node of the step (graph order), :data:`STAT_COLUMNS`.

    Built column by column from numpy arrays (object, float64, bool) and masked
    ``Int64`` arrays, each converted in one call, so its cost is a few
    microseconds a column, not pandas' per-column inference.
    """
    index = step.index
    n = len(index)
    rows, times = step.finished
    cols = list(zip(*rows)) if rows else [()] * 11
    data: dict[str, Any] = {}
    for k, c in enumerate(c for c in STAT_COLUMNS if c not in ("time_s", "mask")):
        col = cols[k]
        if c in ("nan", "inf"):  # None (no statistics) -> NaN -> the masked entry
            counts = np.array(col, dtype=np.float64)
            missing = np.isnan(counts)
            data[c] = pd.arrays.IntegerArray(np.where(missing, 0, counts).astype(np.int64),
                                             missing)
        elif c == "kept":
            data[c] = np.array(col, dtype=bool)
        elif c in ("mean", "std", "min", "max", "norm"):
            data[c] = np.array(col, dtype=np.float64)
        else:  # shapes are tuples: one object each, never a 2-D array
            data[c] = np.fromiter(col, dtype=object, count=n)
    data["time_s"] = np.array(times, dtype=np.float64)
    data["mask"] = np.array(step.mask, dtype=bool)
    # shown in human units, no number wrapped
    return HumanFrame({c: data[c] for c in STAT_COLUMNS}, index=index, copy=False)


def record(joint: TracedGraph, model: nn.Module, inputs: dict[str, Any], *,
           keep_bytes: int = 0) -> Record:
    """Run one real step of ``joint`` and keep statistics of every value it makes.

    Randomness draws from the global generator, as ``joint.run`` does: seed it
    (``torch.manual_seed``) to record the step eager would take from the same seed.

    Args:
        joint: A traced joint graph.
        model: The live model (updated like ``joint.run`` updates it: buffers only).
        inputs: Keyword inputs with the traced structure.
        keep_bytes: Also keep clones of values, in graph order, while their
            total stays within this many bytes (0 keeps none).

    Returns:
        A :class:`Record`.

    Raises:
        RecordError: ``keep_bytes`` is not a non-negative int.
        jointlab.errors.NodeExecutionError: A node raised (named, with its source line).
    """
    if isinstance(keep_bytes, bool) or not isinstance(keep_bytes, int) or keep_bytes < 0:
        raise RecordError(f"keep_bytes must be a non-negative int, got {keep_bytes!r}")
    # keeping values observes every node; else views' rows are derived after the step
    gm, rec = (joint.cached("record.instrumented", instrument) if not keep_bytes else
               joint.cached("record.instrumented.keep", _instrument_all))
    rec.reset(keep_bytes)

    def run(*args: Any) -> Any:
        rec.start()
        try:
            return gm(*args)
        except Exception as exc:
            failed = _next_compute(rec)
            if failed is None:
                raise
            raise node_error(failed, exc, "while recording") from exc

    result = joint.run_with(run, model, inputs)
    return Record(observed=rec.take(), loss=float(result.loss),
                  param_grad_norms=MappingProxyType(_norms(result.grads)),
                  values=MappingProxyType(dict(rec.values)),
                  gradients=joint.cached("record.gradients", _gradient_map),
                  input_grad_norms=MappingProxyType(_norms(result.input_grads)))


def _instrument_all(joint: TracedGraph) -> tuple[fx.GraphModule, ValueObserver]:
    return instrument(joint, derive=False)


def _norms(grads: Mapping[str, torch.Tensor]) -> dict[str, float]:
    return {k: float(torch.linalg.vector_norm(g.detach().float())) for k, g in grads.items()}


def _gradient_map(joint: TracedGraph) -> Mapping[str, str]:
    """:func:`_gradient_nodes` of the joint graph, read-only (cached per graph version)."""
    return MappingProxyType(_gradient_nodes(list(joint.graph_module.graph.nodes)))


def _gradient_nodes(nodes: list[fx.Node]) -> dict[str, str]:
    """The nodes whose value is a gradient, with what they are the gradient of.

    A tied weight in ``mode="aot"`` has one gradient output per alias, which the
    runtime adds after the graph: each is named as one term of that sum.
    """
    terms: dict[str, int] = {}
    for node in nodes:
        info = node_info(node)
        if info.grad_of and not info.zero_grad:
            terms[info.grad_of] = terms.get(info.grad_of, 0) + 1
    out: dict[str, str] = {}
    for node in nodes:
        info = node_info(node)
        probes = sorted({fqn for fqn, _call, _leaf in info.probe_grad})
        if info.grad_of and not info.zero_grad:
            n = terms[info.grad_of]
            out[node.name] = info.grad_of if n == 1 else (
                f"{info.grad_of} (one of {n} alias terms, summed after the graph)")
        elif info.input_grad_of and not info.zero_grad:
            out[node.name] = f"input {info.input_grad_of}"
        elif probes:
            out[node.name] = "output of " + ", ".join(map(module_label, probes))
    return out


def _next_compute(rec: ValueObserver) -> fx.Node | None:
    """The first compute node after the last one observed: the one that raised."""
    for node in rec.nodes[rec.last_done + 1:]:
        if node.op not in ("placeholder", "output"):
            return node
    return None
