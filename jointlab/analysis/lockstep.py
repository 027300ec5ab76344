"""Several rank classes' graphs run side by side, meeting at each collective.

With uneven sharding the ranks of a simulated world do not share one graph
(``jl.trace_ranks`` traces one per rank class), but their collectives still
couple them: rank 3's all-gather needs ranks 0-2's shards. So each class's
graph runs under ``LocalTensorMode`` over its own ranks, node by node, up to
its next functional collective. When every class has stopped at one, they
must be the same collective (op, process group, non-tensor arguments); its
tensor arguments are joined into one ``LocalTensor`` over all ranks, torch's
``LocalTensorMode`` runs it once, and each class takes back its ranks' part.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
from torch import nn

from jointlab import meta as _meta
from jointlab import torch_compat as compat
from jointlab.errors import NodeExecutionError, UnsupportedWrapperError
from jointlab.runtime.dtensor import is_dtensor
from jointlab.runtime.rank_view import as_rank, state_of_ranks
from jointlab.runtime.torch_errors import torch_errors

if TYPE_CHECKING:
    from jointlab.core import TracedGraph

__all__ = ["per_rank", "run_rank_classes"]

Stop = tuple[fx.Node, tuple[Any, ...], dict[str, Any]]
_HINT = ("torch rejected a node while jointlab ran the rank classes' graphs side by side; "
         "compare the classes' collectives (collectives(graphs[rank]) for one rank of each): "
         "they must take tensors of the same shapes on every rank")


def _steps(gm: fx.GraphModule, args: list[Any], stops_at: Callable[[fx.Node], bool]
           ) -> Generator[Stop, Any, Any]:
    """Run ``gm`` node by node; at each node ``stops_at`` picks, yield it and take its value."""
    interp = fx.Interpreter(gm)
    interp.args_iter = iter(args)
    for node in gm.graph.nodes:
        if stops_at(node):
            node_args, kwargs = interp.fetch_args_kwargs_from_env(node)
            interp.env[node] = yield node, node_args, kwargs
        else:
            interp.env[node] = interp.run_node(node)
        if node.op == "output":
            return interp.env[node]
    raise AssertionError("graph without an output node")


@dataclass
class _ClassRun:
    ranks: tuple[int, ...]
    graph: TracedGraph
    flat: list[Any]
    steps: Generator[Stop, Any, Any]
    outputs: Any = None
    done: bool = False

    def advance(self, value: Any) -> Stop | None:
        """Run up to the next collective (sending ``value`` as the last one's result)."""
        with compat.LocalTensorMode(frozenset(self.ranks)):
            try:
                return self.steps.send(value)
            except StopIteration as stop:
                self.outputs, self.done = stop.value, True
                return None


def _signature(stop: Stop) -> tuple[Any, ...]:
    node, args, kwargs = stop
    plain = [a for a in (*args, *kwargs.values()) if not _has_tensor(a)]
    return (_meta.op_name(node), repr(plain))


def _has_tensor(value: Any) -> bool:
    items = value if isinstance(value, (list, tuple)) else [value]
    return any(isinstance(v, torch.Tensor) for v in items)


def _join(values: list[Any], runs: list[_ClassRun]) -> Any:
    """One argument of every class joined over all ranks (a LocalTensor, or lists of them)."""
    first = values[0]
    if isinstance(first, (list, tuple)):
        return type(first)(_join([v[i] for v in values], runs) for i in range(len(first)))
    if not isinstance(first, torch.Tensor):
        return first
    per_rank: dict[int, torch.Tensor] = {}
    for value, run in zip(values, runs):
        own = compat.per_rank_values(value) if isinstance(value, compat.LocalTensor) else {}
        per_rank.update({r: own.get(r, value) for r in run.ranks})
    return compat.LocalTensor(per_rank)


def _part(value: Any, ranks: tuple[int, ...]) -> Any:
    """The part of a joined collective result that belongs to ``ranks``."""
    if isinstance(value, (list, tuple)):
        return type(value)(_part(v, ranks) for v in value)
    if not isinstance(value, compat.LocalTensor):
        return value
    values = compat.per_rank_values(value)
    return compat.LocalTensor({r: values[r] for r in ranks})


def _collective(stops: list[Stop], runs: list[_ClassRun], ranks: tuple[int, ...]) -> list[Any]:
    """Run the collective every class stopped at once over all ranks; each class's part."""
    signatures = {_signature(s) for s in stops}
    if len(signatures) != 1:
        where = "; ".join(f"ranks {r.ranks} at {s[0].name} ({_signature(s)[0]})"
                          for r, s in zip(runs, stops))
        raise UnsupportedWrapperError(
            f"the rank classes' graphs issue different collectives here ({where}), so they "
            "cannot run side by side. Shard so that every rank issues the same collectives.")
    node = stops[0][0]
    n_args = len(stops[0][1])
    args = [_join([s[1][i] for s in stops], runs) for i in range(n_args)]
    kwargs = {k: _join([s[2][k] for s in stops], runs) for k in stops[0][2]}
    waits = {u.target for u in node.users if _meta.op_name(u) == "wait_tensor"}
    with compat.LocalTensorMode(frozenset(ranks)):
        out = node.target(*args, **kwargs)
        for wait in waits:  # the graph's own wait op; each class then waits on its part
            for t in out if isinstance(out, (list, tuple)) else [out]:
                wait(t)
    return [_part(out, run.ranks) for run in runs]


def _lockstep(runs: list[_ClassRun], ranks: tuple[int, ...]) -> None:
    values: list[Any] = [None] * len(runs)
    while True:
        stops = [run.advance(v) for run, v in zip(runs, values)]
        if all(run.done for run in runs):
            return
        if any(run.done for run in runs):
            ended = [r.ranks for r in runs if r.done]
            raise UnsupportedWrapperError(
                f"the graph of ranks {ended} ended while other rank classes still wait at a "
                "collective: the classes issue different numbers of collectives, so they "
                "cannot run side by side.")
        values = _collective(stops, runs, ranks)


def _start(cls: tuple[int, ...], graph: TracedGraph, model: nn.Module, inputs: dict[str, Any],
           stops_at: Callable[[fx.Node], bool]) -> _ClassRun:
    if _meta.graph_draws_random(graph.graph):
        raise UnsupportedWrapperError(
            f"the graph of ranks {cls} draws random numbers; run side by side, the rank "
            "classes would not draw what eager draws. Run it without random ops (eval mode, "
            "dropout off) or with even sharding (one graph for every rank).")
    with as_rank(cls[0]), state_of_ranks(model, cls, local=True):
        flat = graph.flat_args(model, inputs)  # checked as the class (its rank reads)
    args = graph.runtime.prepare(graph, flat)
    return _ClassRun(cls, graph, flat, _steps(graph.graph_module, args, stops_at))


def run_rank_classes(graphs: dict[tuple[int, ...], TracedGraph], model: nn.Module,
                     inputs: dict[str, Any], ranks: tuple[int, ...],
                     stops_at: Callable[[fx.Node], bool]
                     ) -> tuple[dict[int, torch.Tensor], dict[str, dict[int, torch.Tensor]],
                                dict[str, torch.Tensor]]:
    """Run each rank class's graph on its ranks, side by side (see the module docstring).

    Args:
        graphs: Rank class to its graph (``RankGraphs.graphs``), covering ``ranks``.
        model: Built and sharded inside ``world.all_ranks()``; its state is viewed
            per class and left as it was (buffer updates go to per-rank copies).
        inputs: Keyword inputs (plain tensors, the same on every rank).
        ranks: Every simulated rank.
        stops_at: The collective-node predicate.

    Returns:
        ``(loss per rank, local gradient per parameter and rank, gathered
        gradient per parameter)``; a gathered gradient is a ``LocalTensor``
        (``DTensor.full_tensor()`` over all ranks) or a plain tensor.

    Raises:
        UnsupportedWrapperError: The classes issue different collectives, or draw
            random numbers.
    """
    runs = [_start(cls, g, model, inputs, stops_at) for cls, g in graphs.items()]
    with torch.no_grad(), torch_errors("jl.run_all_ranks", NodeExecutionError, _HINT):
        _lockstep(runs, ranks)
        finished = [r.graph.runtime.finish(r.graph, list(r.outputs), r.flat) for r in runs]
    loss: dict[int, torch.Tensor] = {}
    local: dict[str, dict[int, torch.Tensor]] = {}
    grads: dict[str, list[Any]] = {}
    for run, (run_loss, run_grads, _) in zip(runs, finished):
        loss.update(per_rank(run_loss, run.ranks))
        for name, g in zip(run.graph.param_names, run_grads):
            local.setdefault(name, {}).update(per_rank(g, run.ranks))
            grads.setdefault(name, []).append(g)
    return loss, local, {n: _gathered(gs, runs, ranks) for n, gs in grads.items()}


def per_rank(value: Any, ranks: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """Each rank's tensor in ``value`` (DTensor's local part, LocalTensor's, or plain)."""
    if is_dtensor(value):
        value = value.to_local()
    if not isinstance(value, compat.LocalTensor):
        return dict.fromkeys(ranks, value)
    values = compat.per_rank_values(value)
    return {r: values[r] for r in ranks}


def _gathered(grads: list[Any], runs: list[_ClassRun], ranks: tuple[int, ...]) -> Any:
    """The full value of one parameter's gradient from every class's local part."""
    if not is_dtensor(grads[0]):
        return _join(grads, runs)
    placements = {tuple(g.placements) for g in grads}
    if len(placements) != 1:
        raise UnsupportedWrapperError(
            f"the rank classes' gradients are placed differently ({sorted(map(str, placements))})"
            "; jointlab cannot gather them into one value.")
    local = _join([g.to_local() for g in grads], runs)
    with compat.LocalTensorMode(frozenset(ranks)):
        full = type(grads[0]).from_local(local, grads[0].device_mesh, grads[0].placements,
                                         run_check=False, shape=grads[0].shape,
                                         stride=grads[0].stride()).full_tensor()
    return full
