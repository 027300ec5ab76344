"""Distributed models: the fake world, and wrappers jointlab cannot trace refused.

FSDP2's ``fully_shard`` swaps parameters between sharded and unsharded
storages in forward/backward hooks, outside autograd. A make_fx trace of it
"succeeds" with a fraction of the backward and its graph can crash the
process when run, so it is refused with the routes that work: DTensor
parameters (``parallelize_module`` tensor parallelism, or a SimpleFSDP-style
parametrisation whose all-gathers are ordinary ops in the forward), which
both modes trace as local shards (make_fx: :mod:`jointlab.runtime.dtensor`;
AOT: :mod:`jointlab.trace.aot_subclass`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from torch import nn

from jointlab.errors import UnsupportedWrapperError
from jointlab.meta import module_label
from jointlab.runtime.dtensor import is_dtensor
from jointlab.torch_compat import fsdp_module_class


def _fsdp1_class() -> Any:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        return None
    return FullyShardedDataParallel


def _ddp_class() -> Any:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return None
    return DistributedDataParallel


_DDP = (
    "module '{name}' is wrapped by DistributedDataParallel, whose gradient all-reduce "
    "runs in hooks its C++ reducer puts on the parameters' gradients, not as autograd "
    "ops, so a joint graph of it would miss the all-reduce. Trace the "
    "wrapped model, ddp.module (its graph is one rank's step before the all-reduce), or "
    "make data parallelism part of the graph: Replicate DTensor parameters "
    "(torch.distributed.tensor.distribute_tensor on a mesh of jl.fake_world(...)), whose "
    "gradient all-reduce both modes trace as ops.")


def refuse_unsupported_wrappers(model: nn.Module, mode: str = "make_fx",
                                dynamic: bool = False) -> None:
    """Raise :class:`UnsupportedWrapperError` for FSDP- or DDP-wrapped modules in ``model``.

    Args:
        model: The model about to be traced (not changed).
        mode: The tracing mode (both trace DTensor state as local shards).
        dynamic: Whether some input dims are symbolic.

    Raises:
        UnsupportedWrapperError: A module is ``fully_shard``-ed (FSDP2), FSDP1- or DDP-wrapped,
            or it has DTensor state :func:`refuse_dtensor_state` refuses.
    """
    kinds = [(c, what) for c, what in ((fsdp_module_class(), "FSDP2 fully_shard"),
                                       (_fsdp1_class(), "FSDP1 FullyShardedDataParallel"))
             if c is not None]
    ddp = _ddp_class()
    for name, mod in model.named_modules():
        if ddp is not None and isinstance(mod, ddp):
            raise UnsupportedWrapperError(_DDP.format(name=name or "<root>"))
        for cls, what in kinds:
            if isinstance(mod, cls):
                raise UnsupportedWrapperError(
                    f"module '{module_label(name)}' ({type(mod).__name__}) is wrapped by {what}, "
                    "which reshards parameters in hooks outside autograd, so its joint graph "
                    "would miss most of the backward. Trace the model before sharding it, or "
                    "shard with DTensor parameters instead (tensor parallelism with "
                    "torch.distributed.tensor.parallel.parallelize_module, or a "
                    "SimpleFSDP-style parametrisation: all-gathers as ops in the forward) "
                    "inside jl.fake_world(...), and trace it (mode='make_fx' or mode='aot'), "
                    "which traces each DTensor parameter as this rank's local shard.")
    refuse_dtensor_state(model, mode, dynamic)


def refuse_dtensor_state(model: nn.Module, mode: str = "make_fx", dynamic: bool = False
                         ) -> None:
    """Raise :class:`UnsupportedWrapperError` for DTensor state jointlab cannot trace honestly.

    Both modes trace DTensor parameters and buffers as their local shards
    (make_fx: :mod:`jointlab.runtime.dtensor`; AOT: :mod:`jointlab.trace.aot_subclass`).
    Refused in both: dynamic shapes with DTensor state, ``Partial`` parameters or
    buffers (their local tensor is not a shard of the value), and one tensor
    dimension sharded over several mesh dimensions.

    Args:
        model: The model about to be traced (not changed).
        mode: The tracing mode (named in the messages).
        dynamic: Whether some input dims are symbolic.

    Raises:
        UnsupportedWrapperError: A parameter or buffer is a DTensor in one of those cases.
    """
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if not is_dtensor(t):
            continue
        where = f"'{name}' is a DTensor ({t.placements} on a {tuple(t.device_mesh.shape)} mesh)"
        if dynamic:
            raise UnsupportedWrapperError(
                f"{where}; dynamic shapes with DTensor state are not supported (mode={mode!r}). "
                "Trace with static shapes (dynamic=False, no dynamic_arg_dims), in "
                "mode='make_fx' or mode='aot'.")
        if any(p.is_partial() for p in t.placements):
            raise UnsupportedWrapperError(
                f"{where}; a Partial parameter or buffer holds a partial sum, not a shard of "
                "its value, so jointlab does not trace it. Place it Shard or Replicate.")
        if shards_one_dim_twice(t.placements):
            raise UnsupportedWrapperError(
                f"{where}; one tensor dimension is sharded over several mesh dimensions. "
                "Redistributing it slices by this rank's mesh coordinate, so the graph "
                "traced on one rank would bake that rank's slice index and compute wrong "
                "values on the others. Shard different tensor dimensions per mesh "
                "dimension (e.g. (Shard(1), Shard(0)) for dp x tp).")


_LOSS_PARALLEL = (
    "torch.distributed.tensor.parallel.loss_parallel() is not supported (mode={mode!r}): its "
    "cross-entropy handlers run outside the ops jointlab traces as local shards, so the "
    "graph is either refused by torch or wrong across ranks. Trace the step without "
    "loss_parallel(): compute the loss on logits that are not sharded on the class "
    "dimension.")


def refuse_loss_parallel(mode: str) -> None:
    """Raise :class:`UnsupportedWrapperError` when ``jl.trace`` runs inside ``loss_parallel()``.

    Raises:
        UnsupportedWrapperError: Loss parallel is active now.
    """
    from jointlab.torch_compat import loss_parallel_active

    if loss_parallel_active():
        raise UnsupportedWrapperError(
            "jl.trace was called inside loss_parallel(). " + _LOSS_PARALLEL.format(mode=mode))


@contextlib.contextmanager
def loss_parallel_refusals(mode: str) -> Iterator[None]:
    """Refuse ``loss_parallel()`` entered by ``train_fn`` while it is traced (its line named).

    Yields:
        Nothing; torch's function is back on exit.
    """
    from jointlab.patching import patched
    from jointlab.runtime.torch_errors import caller_line
    from jointlab.torch_compat import loss_parallel_entry

    entry = loss_parallel_entry()
    if entry is None:
        yield
        return

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise UnsupportedWrapperError(
            f"train_fn enters loss_parallel(){caller_line()}. " + _LOSS_PARALLEL.format(mode=mode))

    with patched([(*entry, refuse)]):
        yield


def _schedule_classes() -> list[Any]:
    try:
        from torch.distributed.pipelining import schedules
    except ImportError:  # a torch without pipelining: nothing to refuse
        return []
    return [c for c in (getattr(schedules, "PipelineScheduleSingle", None),
                        getattr(schedules, "PipelineScheduleMulti", None)) if c is not None]


@contextlib.contextmanager
def pipeline_schedule_refusals() -> Iterator[None]:
    """Refuse a pipeline schedule's ``step`` called by ``train_fn`` (its line named).

    Yields:
        Nothing; torch's methods are back on exit.
    """
    from jointlab.patching import patched
    from jointlab.runtime.torch_errors import caller_line

    def refusal(cls: Any) -> Any:
        def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
            raise UnsupportedWrapperError(
                f"train_fn calls {type(self).__name__}.step(){caller_line()}. A pipeline "
                "schedule is not traceable: it runs each stage's forward and backward "
                "itself (its own backward calls, send/recv between stages, microbatches), "
                "so there is no one loss to take the joint graph of. Trace one stage "
                "instead: jl.trace(stage.submod, train_fn, inputs) with a train_fn that "
                "runs that submodule on one microbatch and returns a scalar (for a middle "
                "stage, e.g. the sum of its output times a fixed random tensor), or trace "
                "the whole model before it is split into stages.")
        return refuse

    with patched([(c, "step", refusal(c)) for c in _schedule_classes()]):
        yield


def shards_one_dim_twice(placements: Any) -> bool:
    """True when two mesh dimensions shard the same tensor dimension (nested sharding)."""
    dims = [getattr(p, "dim", None) for p in placements if p.is_shard()]
    return len(dims) != len(set(dims)) or any(
        type(p).__name__ == "_StridedShard" for p in placements)


def refuse_dtensor_state_on_old_torch(model: nn.Module) -> None:
    """Raise :class:`~jointlab.errors.UnsupportedTorchError` for DTensor state before torch 2.13.

    Raises:
        UnsupportedTorchError: A parameter or buffer is a DTensor and torch is older
            than 2.13 (see :func:`jointlab.torch_compat.require_distributed_tracing`).
    """
    from jointlab.torch_compat import require_distributed_tracing

    state = [*model.parameters(), *model.buffers()]
    if any(is_dtensor(t) for t in state):
        require_distributed_tracing("jl.trace on a model with DTensor parameters")


def refuse_dtensor_inputs(inputs: Any) -> None:
    """Raise :class:`UnsupportedWrapperError` for a DTensor among the step's inputs.

    Only parameters and buffers are traced as local shards; a DTensor input
    would be baked into the graph as a fake constant.

    Args:
        inputs: The keyword inputs of the training step (any nesting of lists,
            tuples and dicts).

    Raises:
        UnsupportedWrapperError: An input is a DTensor.
    """
    stack = [("inputs", inputs)]
    while stack:
        path, value = stack.pop()
        if is_dtensor(value):
            raise UnsupportedWrapperError(
                f"{path} is a DTensor ({value.placements}); jointlab traces DTensor "
                "parameters and buffers as local shards, but not DTensor inputs. Pass "
                "inputs as plain (local) tensors: x.to_local() on each rank.")
        if isinstance(value, dict):
            stack += [(f"{path}[{k!r}]", v) for k, v in value.items()]
        elif isinstance(value, (list, tuple)):
            stack += [(f"{path}[{i}]", v) for i, v in enumerate(value)]


class FakeWorld:
    """A simulated world: the ``fake`` process-group backend and a CPU device mesh."""

    def __init__(self, world_size: int, mesh: dict[str, int] | None, rank: int) -> None:
        self.world_size, self.rank = world_size, rank
        self.mesh_dims = dict(mesh or {"world": world_size})
        self.mesh: Any = None

    def all_ranks(self) -> Any:
        """A ``LocalTensorMode`` over every rank: DTensors made inside hold all ranks' shards.

        Build and shard a model inside it, then pass it to ``jl.run_all_ranks``.

        Returns:
            The context manager (``torch.distributed._local_tensor.LocalTensorMode``).
        """
        from jointlab.torch_compat import LocalTensorMode

        return LocalTensorMode(self.world_size)


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
        UnsupportedTorchError: torch is older than 2.13.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from jointlab.torch_compat import FakeStore, clear_dtensor_caches, require_distributed_tracing

    require_distributed_tracing("jl.fake_world")
    world = FakeWorld(world_size, mesh, rank)
    if math.prod(world.mesh_dims.values()) != world_size:
        raise ValueError(f"mesh {world.mesh_dims} does not multiply to world_size={world_size}")
    if dist.is_initialized():
        raise UnsupportedWrapperError(
            "jl.fake_world needs to own the default process group, but one is already "
            "initialised; call it outside torch.distributed.init_process_group.")
    clear_dtensor_caches()  # shardings cached by another world hold its rank's mesh
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        world.mesh = init_device_mesh("cpu", tuple(world.mesh_dims.values()),
                                      mesh_dim_names=tuple(world.mesh_dims))
        yield world
    finally:
        dist.destroy_process_group()
        clear_dtensor_caches()
