"""Being one rank (or one rank class) of a simulated world, for tracing and running.

``jl.fake_world`` runs this process as rank 0, and a model built inside
``world.all_ranks()`` holds every rank's shard (torch's ``LocalTensor``). To
trace the graph of another rank ``r`` honestly, two things must be rank
``r``'s while make_fx runs:

* what the world reports: :func:`as_rank` makes every ``DeviceMesh`` answer
  ``get_coordinate``/``get_local_rank``/``get_rank`` (the methods torch's
  ``LocalTensorMode`` patches, for all ranks at once) for ``r``, and
  ``torch.distributed.get_rank()`` return ``r``. So DTensor derives from
  rank ``r``'s coordinate whatever it derives from it (uneven chunk sizes,
  padding, which chunk a redistribute keeps). Process groups stay the traced
  world's: a collective names this process's group of its mesh dimension,
  which ``LocalTensorMode`` reads as that dimension's groups on every rank.
* the model's state: :func:`state_of_ranks` swaps each DTensor's local shard
  for rank ``r``'s values (or a ``LocalTensor`` of one class's ranks) and
  puts the model back afterwards, even on error.

:class:`RankGraphs` is what ``jl.trace_ranks`` returns: one graph per rank class.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from jointlab import torch_compat as compat
from jointlab.errors import StateMismatchError, UnsupportedWrapperError
from jointlab.patching import patched
from jointlab.runtime.dtensor import ShardSpec, is_dtensor
from jointlab.runtime.snapshot import ModelSnapshot

if TYPE_CHECKING:
    from jointlab.core import TracedGraph

__all__ = ["RankGraphs", "as_rank", "model_ranks", "state_of_ranks"]


def _coordinate(mesh: Any, rank: int) -> tuple[int, ...] | None:
    return compat.mesh_coordinates(mesh).get(rank)


def _mesh_methods(rank: int) -> dict[str, Any]:
    """DeviceMesh methods that answer for ``rank`` (signatures as torch's own)."""

    def get_coordinate(mesh: Any) -> tuple[int, ...] | None:
        return _coordinate(mesh, rank)

    def in_mesh(mesh: Any) -> bool:
        return _coordinate(mesh, rank) is not None

    def sym_coordinate(mesh: Any, index: int) -> int:
        coord = _coordinate(mesh, rank)
        if coord is None:
            raise UnsupportedWrapperError(
                f"rank {rank} is not part of {mesh}, so it has no coordinate on it; jointlab "
                "traces ranks of meshes they belong to.")
        return coord[index]

    def get_rank(mesh: Any) -> int:
        return rank

    def get_local_rank(mesh: Any, mesh_dim: int | str | None = None) -> int:
        if mesh.ndim > 1 and mesh_dim is None:
            raise RuntimeError(f"Found the DeviceMesh have {mesh.ndim} dimensions",
                               "Optional kwarg `mesh_dim` needs to be specified when "
                               "device_mesh.ndim > 1.")
        dim = mesh.mesh_dim_names.index(mesh_dim) if isinstance(mesh_dim, str) else mesh_dim or 0
        return sym_coordinate(mesh, dim)

    return {"get_coordinate": get_coordinate, "get_local_rank": get_local_rank,
            "get_rank": get_rank, "_is_current_rank_part_of_mesh": in_mesh,
            "_sym_get_coordinate": sym_coordinate}


def _world_get_rank(rank: int) -> Any:
    """``torch.distributed.get_rank`` as rank ``rank`` would see it."""

    def get_rank(group: Any = None) -> int:
        if group is None or group is dist.GroupMember.WORLD:
            return rank
        ranks = dist.get_process_group_ranks(group)
        if rank not in ranks:
            raise UnsupportedWrapperError(
                f"torch.distributed.get_rank(group) was called while jointlab traces rank "
                f"{rank}, but the group is this process's group {ranks}, which rank {rank} is "
                "not in: jointlab cannot tell which of rank "
                f"{rank}'s groups it stands for. Ask the mesh instead: "
                "mesh.get_local_rank(mesh_dim).")
        return ranks.index(rank)

    return get_rank


@contextlib.contextmanager
def as_rank(rank: int) -> Iterator[None]:
    """Make the simulated world report ``rank`` (device meshes and ``dist.get_rank``).

    Args:
        rank: The world rank to be.

    Yields:
        Nothing; everything is put back on exit, even on error.

    Raises:
        UnsupportedTorchError: This torch's meshes report the rank in a way jointlab
            does not know.
    """
    from torch.distributed import device_mesh, distributed_c10d

    names = compat.mesh_rank_methods()
    impls = _mesh_methods(rank)
    patches = [(device_mesh.DeviceMesh, n, impls[n]) for n in names]
    original, get_rank = distributed_c10d.get_rank, _world_get_rank(rank)
    patches += [(mod, "get_rank", get_rank) for mod in (dist, distributed_c10d, device_mesh)
                if getattr(mod, "get_rank", None) is original]
    with patched(patches):
        yield


def model_ranks(model: nn.Module) -> tuple[int, ...]:
    """The simulated ranks whose shards ``model``'s DTensors hold (``world.all_ranks()``).

    Raises:
        StateMismatchError: The model has no DTensor parameter, or its DTensors hold
            one rank's shard.
    """
    for p in model.parameters():
        if is_dtensor(p):
            local = p.to_local()
            if not isinstance(local, compat.LocalTensor):
                if all(x.is_replicate() for x in p.placements):
                    continue  # one plain replica serves every rank (SequenceParallel's norms)
                raise StateMismatchError(
                    f"this needs a model whose DTensors hold every rank's shard, but "
                    f"'{type(local).__name__}' holds one rank's: build and shard the model "
                    "inside `with world.all_ranks():`.")
            return tuple(sorted(compat.per_rank_values(local)))
    raise StateMismatchError("this needs a model with DTensor parameters (built and sharded "
                             "inside `with world.all_ranks():`).")


def _of_ranks(value: torch.Tensor, ranks: tuple[int, ...], local: bool) -> torch.Tensor:
    """``value`` of ``ranks`` only: a LocalTensor, or one rank's plain tensor (not ``local``)."""
    values = compat.per_rank_values(value)
    missing = [r for r in ranks if r not in values]
    if missing:
        raise StateMismatchError(f"the model holds no values of ranks {missing} "
                                 f"(it holds ranks {sorted(values)}).")
    if len(ranks) == 1 and not local:
        return values[ranks[0]]
    return compat.LocalTensor({r: values[r] for r in ranks})


def _view_of(fqn: str, t: torch.Tensor, ranks: tuple[int, ...], is_param: bool, local: bool
             ) -> torch.Tensor:
    if is_dtensor(t):
        spec = ShardSpec.of(fqn, t)
        inner = spec.local(t)
        if not isinstance(inner, compat.LocalTensor):
            return t
        new = spec.wrap(_of_ranks(inner, ranks, local))
    elif isinstance(t, compat.LocalTensor):
        new = _of_ranks(t, ranks, local)
    elif is_param or not local:
        return t  # the same plain value on every rank
    else:  # a plain buffer: each rank its own copy, so in-place updates stay per rank
        new = compat.LocalTensor({r: t.detach().clone() for r in ranks})
    return nn.Parameter(new, requires_grad=t.requires_grad) if is_param else new


@contextlib.contextmanager
def state_of_ranks(model: nn.Module, ranks: tuple[int, ...], local: bool = False
                   ) -> Iterator[nn.Module]:
    """Swap ``model``'s state for the values of ``ranks`` while inside; restore it after.

    One rank (and not ``local``): each DTensor (and each ``LocalTensor``) gets
    that rank's plain local tensor, to trace. Otherwise a ``LocalTensor`` of just
    those ranks, and plain buffers a copy per rank (so in-place updates stay
    per rank and off the model), to run under ``LocalTensorMode(ranks)``.
    Tied tensors stay tied.

    Args:
        model: A model built and sharded inside ``world.all_ranks()``.
        ranks: The ranks to keep.
        local: Keep ``LocalTensor`` values even for one rank.

    Yields:
        ``model`` itself, holding the swapped state.
    """
    snapshot = ModelSnapshot.take(model)
    names = {id(t): n for n, t in [*model.named_parameters(remove_duplicate=False),
                                   *model.named_buffers(remove_duplicate=False)]}
    views: dict[int, torch.Tensor] = {}
    try:
        for mod in model.modules():
            for store, is_param in zip(compat.module_stores(mod), (True, False)):
                for name, t in list(store.items()):
                    if t is None:
                        continue
                    if id(t) not in views:
                        views[id(t)] = _view_of(names.get(id(t), name), t, ranks, is_param,
                                                 local)
                    store[name] = views[id(t)]
        yield model
    finally:
        snapshot.restore()


@dataclass(frozen=True)
class RankGraphs:
    """One joint graph per rank class of a simulated world (``jl.trace_ranks``).

    Ranks are in one class when every DTensor input has the same local shape
    on them (:attr:`DTensorRuntime.rank_classes`) and they read the same
    values wherever the user's code reads the rank, or torch's DTensor reads
    the mesh coordinate to choose values (the graph's ``rank`` assumptions: a
    ``Replicate -> Shard`` redistribute of sequence parallel, a vocab-parallel
    embedding's mask); each class was traced once, as its first rank (that
    rank's shards and mesh coordinate).
    ``jl.run_all_ranks(result, model, inputs)`` runs every rank on its class's
    graph and checks each rank against its own eager step (``matches_eager``).

    Attributes:
        graphs: Rank class (tuple of ranks) to its joint graph, read-only.
        world_size: Number of simulated ranks.
    """

    graphs: Mapping[tuple[int, ...], TracedGraph]
    world_size: int

    def __post_init__(self) -> None:
        """Freeze the mapping."""
        object.__setattr__(self, "graphs", MappingProxyType(dict(self.graphs)))

    @property
    def classes(self) -> tuple[tuple[int, ...], ...]:
        """The rank classes, in the order of their first rank."""
        return tuple(sorted(self.graphs, key=min))

    def rank_class(self, rank: int) -> tuple[int, ...]:
        """The class (tuple of ranks) ``rank`` belongs to.

        Raises:
            KeyError: ``rank`` is in no class.
        """
        for cls in self.graphs:
            if rank in cls:
                return cls
        raise KeyError(f"rank {rank} is not one of the {self.world_size} simulated ranks")

    def __getitem__(self, rank: int) -> TracedGraph:
        """The graph ``rank`` runs."""
        return self.graphs[self.rank_class(rank)]

    def __len__(self) -> int:
        """The number of distinct graphs (rank classes)."""
        return len(self.graphs)

    def __repr__(self) -> str:
        """Which ranks share which graph."""
        lines = [f"RankGraphs: {self.world_size} ranks, {len(self)} distinct graph"
                 f"{'' if len(self) == 1 else 's'}"]
        for i, cls in enumerate(self.classes):
            who = f"rank {cls[0]}" if len(cls) == 1 else f"ranks {', '.join(map(str, cls))}"
            nodes = len(self.graphs[cls].graph.nodes)
            share = "runs" if len(cls) == 1 else "share"
            lines.append(f"  graph {i}: {who} {share} it (traced as rank {cls[0]}, "
                         f"{nodes} nodes)")
        lines.append("  Ranks share a graph when their local shapes match and they read the "
                     "same rank values (joint.guards); jl.run_all_ranks checks every rank "
                     "against its own eager step.")
        return "\n".join(lines)
