"""Distributed models: wrappers jointlab cannot trace are refused before tracing.

FSDP2's ``fully_shard`` swaps parameters between sharded and unsharded
storages in forward/backward hooks, outside autograd. A make_fx trace of it
"succeeds" with a fraction of the backward and its graph can crash the
process when run, so it is refused with the routes that work: DTensor
parameters (``parallelize_module`` tensor parallelism, or a SimpleFSDP-style
parametrisation whose all-gathers are ordinary ops in the forward).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from torch import nn

from jointlab.errors import UnsupportedWrapperError


def _fsdp_module_class() -> Any:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2 (or without distributed): nothing to refuse
        return None
    return FSDPModule


def _fsdp1_class() -> Any:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        return None
    return FullyShardedDataParallel


def refuse_unsupported_wrappers(model: nn.Module) -> None:
    """Raise :class:`UnsupportedWrapperError` for FSDP-wrapped modules in ``model``.

    Args:
        model: The model about to be traced (not changed).

    Raises:
        UnsupportedWrapperError: A module is ``fully_shard``-ed (FSDP2) or FSDP1-wrapped.
    """
    kinds = [(c, what) for c, what in ((_fsdp_module_class(), "FSDP2 fully_shard"),
                                       (_fsdp1_class(), "FSDP1 FullyShardedDataParallel"))
             if c is not None]
    for name, mod in model.named_modules():
        for cls, what in kinds:
            if isinstance(mod, cls):
                raise UnsupportedWrapperError(
                    f"module '{name or '<root>'}' ({type(mod).__name__}) is wrapped by {what}, "
                    "which reshards parameters in hooks outside autograd, so its joint graph "
                    "would miss most of the backward. Trace the model before sharding it, or "
                    "shard with DTensor parameters instead: tensor parallelism with "
                    "torch.distributed.tensor.parallel.parallelize_module, or a "
                    "SimpleFSDP-style parametrisation (all-gathers as ops in the forward), "
                    "inside jl.fake_world(...).")
    refuse_dtensor_state(model)


def _dtensor_class() -> Any:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return None
    return DTensor


def refuse_dtensor_state(model: nn.Module) -> None:
    """Raise :class:`UnsupportedWrapperError` for DTensor parameters or buffers.

    Traced as they are, DTensor parameters give a graph that computes from
    baked fake shards and counts global bytes, so they are refused until the
    local-shard unwrap lands.

    Args:
        model: The model about to be traced (not changed).

    Raises:
        UnsupportedWrapperError: A parameter or buffer is a DTensor.
    """
    cls = _dtensor_class()
    if cls is None:
        return
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if isinstance(t, cls):
            raise UnsupportedWrapperError(
                f"'{name}' is a DTensor ({t.placements} on a {tuple(t.device_mesh.shape)} mesh). "
                "jointlab cannot trace DTensor state yet: the graph would compute from baked "
                "fake shards and count global bytes. Trace the unsharded model, or write the "
                "collectives with torch.distributed._functional_collectives on local tensors "
                "(they appear as graph nodes; see jointlab.analysis.distributed.collectives).")


class FakeWorld:
    """A simulated world: the ``fake`` process-group backend and a CPU device mesh."""

    def __init__(self, world_size: int, mesh: dict[str, int] | None, rank: int) -> None:
        self.world_size, self.rank = world_size, rank
        self.mesh_dims = dict(mesh or {"world": world_size})
        self.mesh: Any = None


@contextlib.contextmanager
def fake_world(world_size: int, mesh: dict[str, int] | None = None, rank: int = 0
               ) -> Iterator[FakeWorld]:
    """Simulate ``world_size`` ranks in this process (``fake`` backend, CPU mesh).

    Args:
        world_size: Number of simulated ranks.
        mesh: Mesh dimension names to sizes, e.g. ``{"dp": 4, "tp": 2}``;
            their product must be ``world_size`` (default: one dim, ``world``).
        rank: The rank this process plays.

    Yields:
        A :class:`FakeWorld` whose ``mesh`` is the ``DeviceMesh``.

    Raises:
        ValueError: The mesh does not multiply to ``world_size``.
        UnsupportedWrapperError: A process group is already initialised.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from jointlab.torch_compat import FakeStore

    world = FakeWorld(world_size, mesh, rank)
    if math.prod(world.mesh_dims.values()) != world_size:
        raise ValueError(f"mesh {world.mesh_dims} does not multiply to world_size={world_size}")
    if dist.is_initialized():
        raise UnsupportedWrapperError(
            "jl.fake_world needs to own the default process group, but one is already "
            "initialised; call it outside torch.distributed.init_process_group.")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        world.mesh = init_device_mesh("cpu", tuple(world.mesh_dims.values()),
                                      mesh_dim_names=tuple(world.mesh_dims))
        yield world
    finally:
        dist.destroy_process_group()
