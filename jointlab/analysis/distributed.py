"""Collectives of a joint graph: one row per functional collective node.

Functional collectives (``torch.ops._c10d_functional.*``) are ordinary graph
nodes whose result is only valid after the matching ``wait_tensor``. This
reader lists them with their phase, module, process group (and mesh
dimension when a ``DeviceMesh`` is given), the bytes they produce on this
rank, and the ``wait_tensor`` that completes them.

:func:`run_all_ranks` runs a graph traced from DTensor state (on one rank of
``jl.fake_world``), or the per-class graphs of ``jl.trace_ranks``
(:mod:`jointlab.analysis.lockstep`), for every rank at once under torch's
``LocalTensorMode``, and gathers the gradients, so they can be checked
against a single-device step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
import torch.fx as fx
from torch import nn

from jointlab import meta as _meta
from jointlab import torch_compat as compat  # LocalTensor names resolve on first use
from jointlab.analysis.lockstep import per_rank, run_rank_classes
from jointlab.analysis.plan_check import PlanCheck, check_plan
from jointlab.errors import StateMismatchError
from jointlab.runtime.dtensor import DTensorRuntime, classes_sharing, is_dtensor
from jointlab.runtime.rank_reads import rank_reads
from jointlab.runtime.rank_view import RankGraphs, model_ranks
from jointlab.runtime.saved_world import WorldRuntime, group_name
from jointlab.runtime.train_fn import split_loss

if TYPE_CHECKING:
    from jointlab.core import TracedGraph

COLUMNS = ["node", "op", "phase", "module", "group", "mesh_dim", "bytes", "wait", "source"]


def is_collective(node: fx.Node) -> bool:
    """True for a functional collective node (``_c10d_functional`` op, not a wait)."""
    return (_meta.is_aten_op(node) and compat.is_functional_collective(node.target)
            and _meta.op_name(node) != "wait_tensor")


def _wait_of(node: fx.Node) -> str:
    return next((u.name for u in node.users if _meta.op_name(u) == "wait_tensor"), "")


def collective_group(node: fx.Node) -> str:
    """The process-group name a collective node runs on ("" if it names none)."""
    return group_name(node)


def comm_bytes(node: fx.Node) -> int:
    """Bytes a collective node produces on this rank (its outputs)."""
    return _bytes(node)


def _bytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    return int(sum(v.numel() * v.element_size() for v in vals if isinstance(v, torch.Tensor)))


def group_dims(joint: TracedGraph, mesh: Any = None) -> dict[str, str]:
    """Process-group name to mesh dimension name: from ``mesh``, else from the DTensor trace."""
    if mesh is None:
        return dict(getattr(joint.runtime, "group_dims", {}))
    return _mesh_dims(mesh)


def _mesh_dims(mesh: Any) -> dict[str, str]:
    names = mesh.mesh_dim_names or tuple(str(i) for i in range(mesh.ndim))
    return {mesh.get_group(i).group_name: name for i, name in enumerate(names)}


def collectives(joint: TracedGraph, mesh: Any = None) -> pd.DataFrame:
    """One row per collective: op, phase, module, group, mesh dim, bytes, its wait.

    Args:
        joint: A traced joint graph.
        mesh: Optional ``DeviceMesh``; its dimension names fill ``mesh_dim``
            (default: the meshes of the DTensor state it was traced from).

    Returns:
        A DataFrame with :data:`COLUMNS`, in graph order (empty if none). Its
        ``attrs["rank_classes"]``, for a DTensor trace, groups the ranks whose inputs
        have this graph's shapes and that read what it read wherever the trace read
        the rank (:func:`~jointlab.runtime.dtensor.classes_sharing`; every other rank
        alone); None otherwise.
    """
    dims = group_dims(joint, mesh)
    rows = []
    for node in joint.graph.nodes:
        if not is_collective(node):
            continue
        info = _meta.info(node)
        group = group_name(node)
        rows.append([node.name, _meta.op_name(node), info.get("phase", ""),
                     info.get("module", ""), group, dims.get(group, ""), _bytes(node),
                     _wait_of(node), info.get("source", "")])
    table = pd.DataFrame(rows, columns=COLUMNS)
    classes = getattr(joint.runtime, "rank_classes", None)
    if classes is not None:
        everyone = tuple(r for cls in classes for r in cls)
        classes = classes_sharing(classes, joint.assumptions.ranks_allowed(everyone))
    table.attrs["rank_classes"] = classes
    return table


@dataclass(frozen=True)
class AllRanksResult:
    """One step of every simulated rank (``jl.run_all_ranks``).

    Attributes:
        ranks: The simulated ranks.
        loss: Each rank's loss.
        grads: Each parameter's gradient gathered to its full value
            (``DTensor.full_tensor()``; the same on every rank).
        local_grads: Each parameter's gradient on each rank (local shard, or
            the plain gradient of a plain parameter).
        matches_eager: Per rank, whether the graph's loss and local gradients are
            bitwise those of that rank's own eager step under the same
            ``LocalTensorMode``: False where the graph holds something of the
            traced rank that this rank computes differently, so it does not
            share the graph. Through a collective such a difference can reach
            other ranks too (a reduce-scatter averages every rank's gradient).
            None when that cannot be checked (no ``train_fn``: a loaded graph
            run without ``train_fn=``; or the graph draws random numbers). Where the user's code
            reads the rank, each rank class's eager step has every rank read it
            as that class (Python takes one branch for all), which is that
            class's own step only where no collective brings it another class's
            values: a rank whose graph differs from it is None (cannot say), not
            False.
        rank_classes: The ranks that ran each graph (one class per graph run).
        plan: With ``reference=``, every rank's loss and gathered gradients
            against one eager step of the unsharded model on one device
            (:class:`jointlab.analysis.plan_check.PlanCheck`); None without.
    """

    ranks: tuple[int, ...]
    loss: dict[int, torch.Tensor]
    grads: dict[str, torch.Tensor]
    local_grads: dict[str, dict[int, torch.Tensor]]
    matches_eager: dict[int, bool | None] | None
    rank_classes: tuple[tuple[int, ...], ...] = ()
    plan: PlanCheck | None = None

    def __repr__(self) -> str:
        """The ranks, their losses, ``matches_eager`` and the plan check, in a few lines."""
        losses = ", ".join(f"{r}: {float(v):.6g}" for r, v in self.loss.items())
        lines = [f"AllRanksResult({len(self.ranks)} ranks in {len(self.rank_classes)} "
                 f"graph{'' if len(self.rank_classes) == 1 else 's'}",
                 f"  loss per rank: {losses}",
                 f"  matches its own eager step per rank: {self.matches_eager}",
                 f"  {len(self.grads)} gathered gradients (res.grads)"]
        if self.plan is not None:
            lines += ["  " + line for line in repr(self.plan).splitlines()]
        return "\n".join(lines) + ")"

    def _repr_html_(self) -> str | None:
        return None if self.plan is None else self.plan._repr_html_()


def _has_dtensor_state(runtime: Any) -> bool:
    """True for a DTensor trace's runtime, or a loaded (gathered) one's that had DTensor state."""
    if isinstance(runtime, DTensorRuntime):
        return True
    return isinstance(runtime, WorldRuntime) and any(f is not None for f in runtime.world.state)


def _check_dtensor_graph(joint: TracedGraph) -> None:
    if not _has_dtensor_state(joint.runtime):
        raise StateMismatchError(
            "jl.run_all_ranks runs a graph traced from DTensor state (either mode); this "
            "graph has none. Use joint.run(model, inputs).")


def _graphs_by_class(joint: TracedGraph | RankGraphs, ranks: tuple[int, ...]
                     ) -> dict[tuple[int, ...], TracedGraph]:
    """Each rank class to the graph its ranks run, checked to cover ``ranks`` exactly."""
    if isinstance(joint, RankGraphs):
        graphs = dict(joint.graphs)
        covered = sorted(r for cls in graphs for r in cls)
        if covered != sorted(ranks):
            raise StateMismatchError(
                f"the rank classes {list(graphs)} cover ranks {covered}, but the model holds "
                f"ranks {list(ranks)}: run it on the model (world) it was traced from.")
        for cls, g in graphs.items():
            _check_dtensor_graph(g)
            g.assumptions.check_ranks(cls, f"The graph of ranks {list(cls)}")
        return graphs
    _check_dtensor_graph(joint)
    classes = joint.runtime.rank_classes
    if classes is None or len(classes) != 1 or set(classes[0]) != set(ranks):
        raise StateMismatchError(
            f"this graph was traced for one rank's local shapes; the ranks that share them are "
            f"{classes} (None: not modelled), but every rank {ranks} must for one graph to run "
            "them all. Trace every rank class with jl.trace_ranks(model, train_fn, inputs) "
            "(model built inside world.all_ranks()) and pass its result here.")
    joint.assumptions.check_ranks(ranks, "jl.run_all_ranks' graph")
    return {tuple(ranks): joint}


def run_all_ranks(joint: TracedGraph | RankGraphs, model: nn.Module, inputs: dict[str, Any],
                  reference: nn.Module | None = None, *,
                  train_fn: Callable[..., Any] | None = None) -> AllRanksResult:
    """Run the graph(s) for every simulated rank at once (``LocalTensorMode``).

    A single graph runs every rank (it must have been traced for all ranks'
    local shapes). A :class:`RankGraphs` (``jl.trace_ranks``) runs each rank
    on its class's graph; the graphs run side by side and meet at each
    collective, which runs once over all ranks (torch's ``LocalTensorMode``
    collectives). There, buffer updates go to per-rank copies, not to ``model``.

    Args:
        joint: A graph traced from DTensor state (either mode) inside ``jl.fake_world``,
            or the :class:`RankGraphs` of ``jl.trace_ranks``.
        model: The same model, built and sharded inside ``world.all_ranks()`` so
            its DTensors hold every rank's shard.
        inputs: Keyword inputs (plain tensors are the same on every rank).
        reference: The unsharded model on one device (as it was before sharding):
            the plan check (``result.plan``) compares every rank's loss and
            gathered gradients with one eager step of it on ``inputs``, which
            finds a plan bug that each rank's own eager step shares.
        train_fn: The training step the eager checks run (default: the traced one;
            pass it for graphs that have none: loaded ones, ``jl.gather_ranks``').

    Returns:
        An :class:`AllRanksResult`.

    Raises:
        StateMismatchError: A graph has no DTensor state, the ranks do not all
            share a single graph's local shapes, or the model is not one of all ranks;
            ``reference`` is not the unsharded model.
        UnsupportedWrapperError: The graphs of several classes issue different
            collectives, or draw random numbers.
    """
    ranks = model_ranks(model)
    graphs = _graphs_by_class(joint, ranks)
    first = next(iter(graphs.values()))
    if len(graphs) == 1:
        with compat.LocalTensorMode(frozenset(ranks)):
            res = first.run(model, inputs)
            full = {n: g.full_tensor() if is_dtensor(g) else g for n, g in res.grads.items()}
        loss = per_rank(res.loss, ranks)
        local = {n: per_rank(g, ranks) for n, g in res.grads.items()}
    else:
        loss, local, full = run_rank_classes(graphs, model, inputs, ranks, is_collective)
    same = _matches_eager(graphs, model, inputs, loss, local, ranks, train_fn)
    full_per_rank = {n: per_rank(g, ranks) for n, g in full.items()}
    gathered = {n: g[ranks[0]] for n, g in full_per_rank.items()}
    plan = None if reference is None else check_plan(
        graphs, model, inputs, loss, full_per_rank, reference, train_fn)
    return AllRanksResult(ranks, loss, gathered, local, same, tuple(graphs), plan)


def _eager_runs(graphs: dict[tuple[int, ...], TracedGraph]
                ) -> list[tuple[int | None, tuple[int, ...]]]:
    """Which rank each eager step answers rank reads as, and the ranks it checks.

    One step for every rank when no graph recorded a rank read; otherwise one
    per rank class, in which the user's code reads the rank as the class's first
    rank (the class's ranks read the same values: the graph's ``rank`` facts).
    """
    if not any(g.assumptions.rank_facts() for g in graphs.values()):
        return [(None, tuple(r for cls in graphs for r in cls))]
    return [(cls[0], cls) for cls in graphs]


def _eager_step(joint: TracedGraph, model: nn.Module, inputs: dict[str, Any],
                ranks: tuple[int, ...], answer_as: int | None, train_fn: Callable[..., Any]
                ) -> tuple[dict[int, torch.Tensor], dict[str, dict[int, torch.Tensor]]]:
    """Every rank's eager step (the user's rank reads answered as ``answer_as``)."""
    params = dict(model.named_parameters())
    with compat.LocalTensorMode(frozenset(ranks)), rank_reads(answer_as):
        eager_loss, _ = split_loss(train_fn(model, **inputs))
        eager = torch.autograd.grad(eager_loss, [params[n] for n in joint.param_names],
                                    allow_unused=True)
        loss = per_rank(eager_loss.detach(), ranks)
        grads = {n: per_rank(g, ranks) for n, g in zip(joint.param_names, eager)
                 if g is not None}
    return loss, grads


def _matches_eager(graphs: dict[tuple[int, ...], TracedGraph], model: nn.Module,
                   inputs: dict[str, Any], loss: dict[int, torch.Tensor],
                   grads: dict[str, dict[int, torch.Tensor]], ranks: tuple[int, ...],
                   train_fn: Callable[..., Any] | None = None
                   ) -> dict[int, bool | None] | None:
    """Each rank's eager step (autograd.grad, buffers put back) against the graph's.

    Where the user's code reads the rank, each rank class's eager step reads it as
    that class (:func:`_eager_runs`), every rank taking that class's branch: exact
    for the class's own ranks unless a collective brings them another class's
    branch. So there a rank that differs is None (cannot say), never False or True.
    """
    joint = next(iter(graphs.values()))
    train_fn = train_fn or joint.train_fn
    if train_fn is None or any(_meta.graph_draws_random(g.graph)
                                     for g in graphs.values()):
        return None
    before = {n: b.detach().clone() for n, b in model.named_buffers()}
    out: dict[int, bool | None] = {}
    runs = _eager_runs(graphs)
    for answer_as, checked in runs:
        eager_loss, eager_grads = _eager_step(joint, model, inputs, ranks, answer_as, train_fn)
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(before[n])
        pairs = [(loss, eager_loss), *((grads[n], g) for n, g in eager_grads.items())]
        same = {r: all(tuple(a[r].shape) == tuple(b[r].shape) and torch.equal(a[r], b[r])
                       for a, b in pairs) for r in checked}
        out.update({r: True if ok else (False if len(runs) == 1 else None)
                    for r, ok in same.items()})
    return {r: out[r] for r in ranks}
