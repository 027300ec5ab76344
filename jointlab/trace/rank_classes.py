"""``jl.trace_ranks``: one joint graph per rank class of a simulated world.

Ranks whose DTensor inputs have the same local shapes form a class
(:func:`jointlab.runtime.dtensor.rank_classes`). Each class is traced once,
as its first rank: the model's DTensors hold that rank's shards and the
world reports that rank (:mod:`jointlab.runtime.rank_view`). Uneven sharding
(6 rows over 4 ranks: 2, 2, 2, 0) gives two classes and two graphs. A
class whose ranks read different values where the user's code reads the
rank (``dist.get_rank()``, ``mesh.get_local_rank()``), or where torch's
DTensor reads the mesh coordinate to choose values (sequence parallel's
``Replicate -> Shard(1)``, a vocab-parallel embedding's mask offset, the
backward of a ``Replicate`` output layout): the graph's ``rank`` assumptions,
is split: the ranks that read what its first rank read share its graph, the
others are traced again as their own class.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from jointlab.errors import TraceError, UnsupportedWrapperError
from jointlab.inputs import model_state
from jointlab.runtime.dtensor import ShardSpec, is_dtensor, rank_classes
from jointlab.runtime.rank_view import RankGraphs, as_rank, model_ranks, state_of_ranks
from jointlab.trace.tracer import trace

__all__ = ["trace_ranks"]


def _classes(model: nn.Module, ranks: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    specs = [ShardSpec.of(n, t) for n, t in model_state(model).items() if is_dtensor(t)]
    classes = rank_classes(specs)
    if classes is None:
        raise UnsupportedWrapperError(
            "jl.trace_ranks cannot tell which ranks share local shapes here: every DTensor "
            "must be placed Shard/Replicate on one fake_world mesh or named slices of it "
            "(not _StridedShard, not several root meshes). Trace one rank with jl.trace.")
    covered = sorted(r for cls in classes for r in cls)
    if covered != sorted(ranks):
        raise UnsupportedWrapperError(
            f"the model holds the shards of ranks {list(ranks)}, but its mesh has ranks "
            f"{covered}: build and shard it inside `with world.all_ranks():` of the same world.")
    return classes


def _uneven(model: nn.Module) -> list[str]:
    """``'fqn' (placement): n over m ranks`` for each DTensor split unevenly."""
    out = []
    for fqn, t in model_state(model).items():
        if not is_dtensor(t):
            continue
        for mesh_dim, p in enumerate(t.placements):
            size, n = t.shape[getattr(p, "dim", 0)], t.device_mesh.size(mesh_dim)
            if p.is_shard() and size % n:
                out.append(f"'{fqn}' ({p}): {size} over {n} ranks")
    return out


@contextlib.contextmanager
def _uneven_named(model: nn.Module, cls: tuple[int, ...]) -> Iterator[None]:
    """A torch failure of an unevenly sharded model, told as what it most likely is."""
    try:
        yield
    except TraceError as exc:
        uneven = _uneven(model)
        if not uneven or type(exc) is not TraceError:  # only a failure inside torch
            raise
        raise UnsupportedWrapperError(
            f"tracing rank {cls[0]}: {str(exc).splitlines()[0].rstrip('.')}. The model has "
            f"uneven shards: {'; '.join(uneven[:4])}. torch's tensor-parallel styles "
            "(ColwiseParallel, RowwiseParallel, SequenceParallel) rebuild DTensors from "
            "local shards assuming even ones (DTensor.from_local without shape=), so an "
            "uneven tensor-parallel split fails on real ranks too. Make each sharded "
            "dimension divisible by its mesh dimension (e.g. hidden 8 over 4 ranks); "
            "uneven SimpleFSDP-style (all-gather) sharding is supported.") from exc


def trace_ranks(model: nn.Module, train_fn: Callable[..., Any], inputs: dict[str, Any],
                **trace_kwargs: Any) -> RankGraphs:
    """Trace every distinct rank class of a simulated world once (either mode).

    Args:
        model: A model built and sharded inside ``world.all_ranks()`` of
            ``jl.fake_world``, so its DTensors hold every rank's shard. It is
            not changed, even on error.
        train_fn: The training step, as for :func:`jointlab.trace`.
        inputs: Keyword inputs (plain tensors, the same on every rank).
        **trace_kwargs: Passed on to :func:`jointlab.trace` (``mode`` included).

    Returns:
        A :class:`RankGraphs`: each rank class (tuple of ranks) to the graph
        traced as its first rank; ranks share a class when their local shapes
        match and they read the same values wherever the user's code reads the
        rank. Its repr says which ranks share which graph.

    Raises:
        StateMismatchError: The model's DTensors do not hold every rank's shard.
        UnsupportedWrapperError: The ranks cannot be grouped (placements not
            modelled), or anything :func:`jointlab.trace` refuses.
    """
    ranks = model_ranks(model)
    todo = list(_classes(model, ranks))
    graphs = {}
    while todo:
        cls = todo.pop(0)
        with as_rank(cls[0]), state_of_ranks(model, (cls[0],)), _uneven_named(model, cls):
            joint = trace(model, train_fn, inputs, **trace_kwargs)
        traced = joint.runtime.rank_classes
        if traced is None or not any(set(cls) <= set(t) for t in traced):  # as planned
            raise UnsupportedWrapperError(
                f"rank {cls[0]} was traced with local shapes that group the ranks as "
                f"{traced}, not as {tuple(graphs) + (cls, *todo)}; jointlab cannot say which "
                "ranks share its graph.")
        same = joint.assumptions.ranks_allowed(cls)  # the ranks that read what it read
        graphs[same] = joint
        rest = tuple(r for r in cls if r not in same)
        if rest:  # they read another rank value: traced as their own class
            todo.insert(0, rest)
    return RankGraphs(graphs, len(ranks))
