"""DTensor state traced as its local shards: unwrap before make_fx, rewrap inside.

A DTensor parameter traced as it is computes from a baked fake shard. So,
as torchtitan's graph trainer does, each DTensor parameter or buffer is
split with the subclass protocol (``__tensor_flatten__``): its one inner
tensor (the local shard) becomes the graph's placeholder, and its other
inner attributes (torch 2.13 lists ``device_mesh`` there) and its flatten
context stay Python constants. Inside the traced function the shard is put
back into a DTensor with ``__tensor_unflatten__``, so DTensor dispatch
records the local ops and the collectives as graph nodes. Gradients are
taken with respect to those DTensors (what eager leaves in ``param.grad``),
and the graph returns their local tensors.

:class:`DTensorRuntime` does the same at ``run()``: it checks the live
model's DTensors against the trace (mesh, placements, this rank's local
shape), feeds their local shards and wraps the gradients back into DTensors
with the placements autograd gave them while tracing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from jointlab import torch_compat as compat
from jointlab.errors import StateMismatchError, UnsupportedWrapperError
from jointlab.inputs import model_state
from jointlab.runtime.plans import AotRuntime, MakeFxRuntime
from jointlab.torch_compat import root_mesh

__all__ = ["DTensorLayout", "DTensorRuntime", "ShardSpec", "classes_sharing", "dtensor_class",
           "group_dims", "is_dtensor", "rank_classes"]


def dtensor_class() -> Any:
    """The DTensor class, or None on a torch without ``torch.distributed.tensor``."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return None
    return DTensor


def is_dtensor(t: Any) -> bool:
    """True when ``t`` is a DTensor."""
    cls = dtensor_class()
    return cls is not None and isinstance(t, cls)


def _placement_text(placements: Any) -> str:
    return ", ".join(str(p) for p in placements)


def _mesh_dim_names(mesh: Any) -> tuple[str, ...]:
    return tuple(mesh.mesh_dim_names or (str(i) for i in range(mesh.ndim)))


def _storage_bytes(local: torch.Tensor) -> int:
    """Bytes of the storage under ``local`` (at least the shard's own bytes).

    For a ``LocalTensor`` (every rank's shard, ``world.all_ranks()``), the largest
    rank's: its sizes are per-rank integers that cannot be compared as one.
    """
    if isinstance(local, compat.LocalTensor):
        return max(map(_storage_bytes, compat.per_rank_values(local).values()), default=0)
    own = local.numel() * local.element_size()
    try:
        return max(own, local.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # a tensor without a plain storage
        return own


@dataclass(frozen=True)
class ShardSpec:
    """How one DTensor parameter, buffer or gradient is split into its local shard.

    Attributes:
        fqn: State name (parameter or buffer).
        inner: Name of the one inner tensor (``_local_tensor``).
        consts: The non-tensor inner attributes (``device_mesh``), kept as they are.
        ctx: The ``__tensor_flatten__`` context.
        global_shape: Shape of the DTensor.
        global_stride: Stride of the DTensor.
        local_shape: Shape of this rank's shard.
        placements: The DTensor's placements, one per mesh dim.
        mesh: Its ``DeviceMesh``.
        storage_bytes: Bytes of the storage holding the local shard: more than the
            shard's own where torch pads it (the short last chunks of an uneven split).
    """

    fqn: str
    inner: str
    consts: dict[str, Any]
    ctx: Any
    global_shape: tuple[int, ...]
    global_stride: tuple[int, ...]
    local_shape: tuple[int, ...]
    placements: tuple[Any, ...]
    mesh: Any
    storage_bytes: int

    @classmethod
    def of(cls, fqn: str, t: torch.Tensor) -> ShardSpec:
        """Split ``t`` with ``__tensor_flatten__``.

        Raises:
            UnsupportedWrapperError: It has more or fewer than one inner tensor.
        """
        names, ctx = t.__tensor_flatten__()
        inner = {n: getattr(t, n) for n in names}
        tensors = [n for n, v in inner.items() if isinstance(v, torch.Tensor)]
        if len(tensors) != 1 or is_dtensor(inner[tensors[0]]):
            raise UnsupportedWrapperError(
                f"'{fqn}' is a {type(t).__name__} whose inner tensors are {tensors}; jointlab "
                "unwraps DTensors with exactly one plain local shard. Trace the unsharded model.")
        local = inner[tensors[0]]
        return cls(fqn, tensors[0], {n: v for n, v in inner.items() if n not in tensors}, ctx,
                   tuple(t.shape), tuple(t.stride()), tuple(local.shape),
                   tuple(t.placements), t.device_mesh, _storage_bytes(local))

    def local(self, t: torch.Tensor) -> torch.Tensor:
        """This DTensor's local shard (the same tensor object, no copy)."""
        return getattr(t, self.inner)

    def wrap(self, local: torch.Tensor) -> torch.Tensor:
        """A DTensor around ``local`` with this spec (``__tensor_unflatten__``)."""
        return dtensor_class().__tensor_unflatten__(
            {**self.consts, self.inner: local}, self.ctx, self.global_shape, self.global_stride)

    def describe(self) -> dict[str, Any]:
        """The facts the node table shows for this shard (JSON-friendly)."""
        names = _mesh_dim_names(self.mesh)
        sharded = [names[i] for i, p in enumerate(self.placements) if not p.is_replicate()]
        return {"local_shape": list(self.local_shape), "global_shape": list(self.global_shape),
                "placement": _placement_text(self.placements),
                "mesh_dim": ",".join(sharded) if sharded else ",".join(names),
                "storage_bytes": self.storage_bytes}

    def matches(self, t: Any) -> str:
        """Why live tensor ``t`` cannot feed this placeholder ("" when it can)."""
        if not is_dtensor(t):
            return f"it is a plain {type(t).__name__}, but it was traced as a DTensor"
        if tuple(t.placements) != self.placements or t.device_mesh != self.mesh:
            return (f"it is placed ({_placement_text(t.placements)}) on mesh "
                    f"{t.device_mesh}; it was traced as ({_placement_text(self.placements)}) "
                    f"on {self.mesh}")
        shape = tuple(self.local(t).shape)
        if shape != self.local_shape:
            return (f"its local shard is {list(shape)} on this rank; the graph was traced "
                    f"for a local shard of {list(self.local_shape)}")
        return ""


@dataclass
class DTensorLayout:
    """The DTensor state of a model, split into local shards for one trace.

    Attributes:
        state: ShardSpec per DTensor parameter or buffer, by FQN.
        grads: ShardSpec of each DTensor gradient seen while tracing, by parameter FQN.
    """

    state: dict[str, ShardSpec] = field(default_factory=dict)
    grads: dict[str, ShardSpec] = field(default_factory=dict)

    @classmethod
    def of(cls, model: nn.Module) -> DTensorLayout:
        """The layout of ``model``'s DTensor state (empty when it has none)."""
        return cls({n: ShardSpec.of(n, t) for n, t in model_state(model).items()
                    if is_dtensor(t)})

    def local_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state`` with each DTensor replaced by its local shard."""
        return {n: self.state[n].local(t) if n in self.state else t for n, t in state.items()}

    def rewrap(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state`` (local shards) with each DTensor entry wrapped back, leaf and trainable."""
        out = dict(state)
        for n, spec in self.state.items():
            out[n] = spec.wrap(state[n])
        return out

    def local_grad(self, fqn: str, grad: torch.Tensor) -> torch.Tensor:
        """The local tensor of a DTensor gradient (recording its spec), else ``grad``."""
        if not is_dtensor(grad):
            return grad
        self.grads[fqn] = ShardSpec.of(fqn, grad)
        return self.grads[fqn].local(grad)

    def plain_output(self, what: str, value: Any) -> Any:
        """A DTensor loss or loss_dict value as a plain tensor, when that is honest.

        Raises:
            UnsupportedWrapperError: It is sharded or partial on some mesh dim.
        """
        if not is_dtensor(value):
            return value
        if not all(p.is_replicate() for p in value.placements):
            raise UnsupportedWrapperError(
                f"train_fn returned {what} as a DTensor placed "
                f"({_placement_text(value.placements)}); "
                "its local tensor is not the value. Return a plain tensor, e.g. "
                "value.full_tensor() or value.redistribute(placements=[Replicate()]).to_local().")
        return value.to_local()

    def placeholder_info(self, fqn: str) -> dict[str, Any]:
        """Extra trace-time facts of a state placeholder (``dtensor``), or nothing."""
        spec = self.state.get(fqn)
        return {} if spec is None else {"dtensor": spec.describe()}

    def runtime(self, fqns: list[str]) -> DTensorRuntime | None:
        """The runtime that feeds local shards at ``run()`` (None without DTensor state)."""
        if not self.state:
            return None
        return DTensorRuntime([self.state.get(n) for n in fqns], dict(self.grads))


def _local_shape(spec: ShardSpec, coord: tuple[int, ...]) -> tuple[int, ...] | None:
    shape = list(spec.global_shape)
    for mesh_dim, p in enumerate(spec.placements):
        if p.is_replicate() or p.is_partial():
            continue
        if not p.is_shard() or type(p).__name__ != "Shard":
            return None  # _StridedShard and others: not modelled
        n, c = spec.mesh.size(mesh_dim), coord[mesh_dim]
        chunk = math.ceil(shape[p.dim] / n) if shape[p.dim] else 0
        shape[p.dim] = max(0, min(shape[p.dim], (c + 1) * chunk) - c * chunk)
    return tuple(shape)


def _coordinates(mesh: Any, root: Any) -> list[tuple[int, ...]] | None:
    """Each root-mesh rank's coordinate on ``mesh`` (in root order), None if unknown."""
    root_names, names = _mesh_dim_names(root), _mesh_dim_names(mesh)
    if mesh is not root and not (mesh.mesh_dim_names and set(names) <= set(root_names)):
        return None
    out = []
    for idx in range(root.mesh.numel()):
        coord = [int(i) for i in torch.unravel_index(torch.tensor(idx), root.mesh.shape)]
        out.append(tuple(coord[root_names.index(n)] for n in names))
    return out


def rank_classes(specs: list[ShardSpec]) -> tuple[tuple[int, ...], ...] | None:
    """World ranks grouped by the local shapes of every DTensor input (None when not modelled).

    Every mesh must be a root mesh or a named slice of one root (a sub-mesh of
    ``jl.fake_world``'s mesh); each rank's local shapes follow from its
    coordinate on each DTensor's mesh (``Shard`` splits like ``torch.chunk``).
    """
    roots = [root_mesh(s.mesh) for s in specs]
    if not specs or any(r is None or r != roots[0] for r in roots):
        return None
    root = roots[0]
    coords = [_coordinates(s.mesh, root) for s in specs]
    if any(c is None for c in coords):
        return None
    ranks = root.mesh.flatten().tolist()
    classes: dict[tuple[Any, ...], list[int]] = {}
    for idx, rank in enumerate(ranks):
        key = tuple(_local_shape(s, c[idx]) for s, c in zip(specs, coords))
        if any(k is None for k in key):
            return None
        classes.setdefault(key, []).append(rank)
    return tuple(tuple(sorted(r)) for r in classes.values())


def classes_sharing(classes: tuple[tuple[int, ...], ...] | None, allowed: tuple[int, ...]
                    ) -> tuple[tuple[int, ...], ...] | None:
    """Shape classes cut by the trace's rank reads: which ranks may share one traced graph.

    Same local shapes are necessary for ranks to share a graph, not enough: where the
    trace read the rank (the user's ``dist.get_rank()``, torch's mesh-coordinate reads),
    ranks that read another value have another graph. Ranks in ``allowed`` (those that
    read what the trace read) keep their shape class; every other rank is a class of
    its own, since one trace cannot say which of them share a graph.

    Args:
        classes: :attr:`DTensorRuntime.rank_classes` (None: not modelled).
        allowed: ``joint.assumptions.ranks_allowed(ranks)`` of the traced graph.

    Returns:
        The classes, or None when ``classes`` is None.
    """
    if classes is None:
        return None
    kept = set(allowed)
    out: list[tuple[int, ...]] = []
    for cls in classes:
        same = tuple(r for r in cls if r in kept)
        out += ([same] if same else []) + [(r,) for r in cls if r not in kept]
    return tuple(out)


def group_dims(meshes: list[Any]) -> dict[str, str]:
    """Process-group name to mesh dimension name, over ``meshes`` and their root meshes."""
    out: dict[str, str] = {}
    for mesh in [*meshes, *(root_mesh(m) for m in meshes)]:
        if mesh is None:
            continue
        for i, name in enumerate(_mesh_dim_names(mesh)):
            out.setdefault(mesh.get_group(i).group_name, name)
    return out


class DTensorRuntime(MakeFxRuntime):
    """make_fx runtime of a graph traced from DTensor state: local shards in, DTensors out.

    Attributes:
        specs: Per state placeholder, its ShardSpec (None for a plain tensor).
        grads: ShardSpec of each DTensor gradient, by parameter FQN.
        rank_classes: Ranks grouped by the local shape of every DTensor input;
            ranks of one class feed this graph inputs of the same shapes. This
            is necessary for sharing the graph, not proof of it: the graph may
            also hold rank-dependent constants (:func:`classes_sharing` cuts
            them by the trace's rank reads). ``jl.run_all_ranks`` runs it
            for every rank and checks each rank against eager; ``jl.trace_ranks``
            traces one graph per class. None when the
            placements are not modelled (e.g. ``_StridedShard``, several meshes).
        group_dims: Process-group name to mesh dimension name, for the
            collectives of this graph.
    """

    def __init__(self, specs: list[ShardSpec | None], grads: dict[str, ShardSpec]) -> None:
        """Hold the trace-time shard specs."""
        self.specs = specs
        self.grads = grads
        self.rank_classes = rank_classes([s for s in specs if s is not None])
        self.group_dims = group_dims([s.mesh for s in specs if s is not None])

    def check_feed(self, flat: list[torch.Tensor]) -> None:
        """Refuse a DTensor whose mesh, placements or local shape differ from the trace.

        Raises:
            StateMismatchError: Naming the tensor and what differs (a plan's own words,
                checked before the guards, whose hook rows would say less).
        """
        for i, spec in enumerate(self.specs):
            why = "" if spec is None else spec.matches(flat[i])
            if why:
                raise StateMismatchError(
                    f"'{spec.fqn}' cannot feed the graph: {why}. Run the graph on the model "
                    "it was traced from (same mesh and plan, same rank class), or trace again.")

    def prepare(self, joint: Any, flat: list[torch.Tensor]) -> list[Any]:
        """Check each DTensor against the trace and pass its local shard.

        Raises:
            StateMismatchError: A DTensor's mesh, placements or local shape differ.
        """
        self.check_feed(flat)
        return [t if spec is None else spec.local(t) for t, spec in
                zip(flat, [*self.specs, *[None] * (len(flat) - len(self.specs))])]

    def finish(self, joint: Any, outputs: list[Any], flat: list[torch.Tensor]
               ) -> tuple[Any, list[torch.Tensor], list[Any]]:
        """Split the outputs and wrap each DTensor gradient back into a DTensor."""
        loss, grads, ld = super().finish(joint, outputs, flat)
        k = len(joint.param_names)  # input gradients (after the parameters') stay plain
        grads = [self.grads[n].wrap(g) if n in self.grads else g
                 for n, g in zip(joint.param_names, grads)] + grads[k:]
        return loss, grads, ld


class AotDTensorRuntime(DTensorRuntime):
    """AOT runtime of a graph traced from DTensor state: local shards in, DTensors out.

    The AOT plan (:class:`AotRuntime`) places the local shards on the graph's
    arguments and reads its outputs back; :class:`DTensorRuntime` checks the
    live DTensors against the trace and wraps the gradients. Graphs with this
    runtime are not saved (the mesh is a live process-group object).

    Attributes:
        plan: The AOT call plan over jointlab's flat layout.
    """

    def __init__(self, plan: AotRuntime, specs: list[ShardSpec | None],
                 grads: dict[str, ShardSpec]) -> None:
        """Hold the AOT plan and the trace-time shard specs."""
        super().__init__(specs, grads)
        self.plan = plan

    def prepare(self, joint: Any, flat: list[torch.Tensor]) -> list[Any]:
        """Check each DTensor, then lay the local shards out as the AOT graph takes them.

        Raises:
            StateMismatchError: A DTensor's mesh, placements or local shape differ.
        """
        return self.plan.prepare(joint, super().prepare(joint, flat))

    def finish(self, joint: Any, outputs: list[Any], flat: list[torch.Tensor]
               ) -> tuple[Any, list[torch.Tensor], list[Any]]:
        """Apply buffer updates to the local shards, wrap each gradient back into a DTensor."""
        local = list(flat)
        for i, spec in enumerate(self.specs):
            if spec is not None:
                local[i] = spec.local(flat[i])
        loss, grads, ld = self.plan.finish(joint, outputs, local)
        state = {s.fqn: s for s in self.specs if s is not None}
        wrapped = []
        for name, g in zip(joint.param_names, grads):
            spec = self.grads.get(name) or state.get(name)  # unused: zeros in the param's layout
            wrapped.append(g if spec is None else spec.wrap(g))
        return loss, wrapped + grads[len(wrapped):], ld
