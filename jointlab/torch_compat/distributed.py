"""Guarded accessors for torch's distributed internals: meshes, LocalTensor, FSDP2, AOT subclasses.

The root of a sliced ``DeviceMesh``, every rank's coordinates, the mesh
methods ``LocalTensorMode`` patches, each rank's values of a ``LocalTensor``,
FSDP2's memory tracker, and the subclass metadata an AOT joint export keeps
for DTensor gradients. The ``LocalTensorMode`` jointlab enters (every rank at
once) is in :mod:`jointlab.torch_compat.every_rank`.
"""

from __future__ import annotations

from typing import Any

import torch

from jointlab.torch_compat._base import release, required, resolve, torch_attr, unsupported

#: The first torch release whose fake process group and DTensor internals jointlab's
#: simulated worlds and DTensor tracing were verified on. On 2.11 the fake backend's
#: collectives return uninitialised memory (eager's loss is NaN), AOT exports keep no
#: subclass metadata for DTensor gradients, and DTensor.from_local reads a data-dependent
#: scalar under make_fx: refused rather than half-working.
DISTRIBUTED_SINCE = (2, 13, 0)


def require_distributed_tracing(what: str) -> None:
    """Refuse jointlab's simulated worlds and DTensor tracing on a torch older than 2.13.

    Args:
        what: The entry point, e.g. ``"jl.fake_world"``.

    Raises:
        UnsupportedTorchError: This torch is older than :data:`DISTRIBUTED_SINCE`.
    """
    if release(torch.__version__) < DISTRIBUTED_SINCE:
        raise unsupported(
            "the fake process group and DTensor behaviour jointlab's distributed tracing "
            "is built on", f"run {what} (simulated worlds, DTensor parameters)",
            since=".".join(map(str, DISTRIBUTED_SINCE[:2])))


def root_mesh(mesh: Any) -> Any:
    """The ``DeviceMesh`` a sub-mesh was sliced from (``mesh`` itself when it is a root).

    Returns None on a torch whose ``DeviceMesh`` lacks ``_get_root_mesh``.
    """
    get_root = getattr(mesh, "_get_root_mesh", None)
    return get_root() if callable(get_root) else None


def group_ranks(name: str) -> tuple[int, ...] | None:
    """The world ranks of the live process group called ``name`` (None: no such group).

    Raises:
        UnsupportedTorchError: This torch cannot look a process group up by name.
    """
    import torch.distributed as dist

    resolve_group = torch_attr("torch.distributed.distributed_c10d", "_resolve_process_group",
                               "find the process group a saved collective names")
    if not dist.is_initialized():
        return None
    try:
        group = resolve_group(name)
    except (ValueError, RuntimeError, KeyError):
        return None
    return tuple(dist.get_process_group_ranks(group))


def per_rank_values(t: torch.Tensor) -> dict[int, torch.Tensor]:
    """Each simulated rank's tensor inside a ``LocalTensor`` (``LocalTensorMode``).

    Raises:
        UnsupportedTorchError: ``t`` has no per-rank tensors on this torch.
    """
    values = getattr(t, "_local_tensors", None)
    if not isinstance(values, dict):
        raise unsupported("LocalTensor._local_tensors", "read every simulated rank's values")
    return dict(values)


def mesh_coordinates(mesh: Any) -> dict[int, tuple[int, ...]]:
    """Each rank's coordinate on ``mesh`` (a root mesh or a slice of one), in pure Python.

    It follows ``DeviceMesh``'s layout the way ``_MeshLayout.remap_to_tensor``
    does (one copy of the sub-mesh per complement offset), without tensor ops, so
    it is safe to call while make_fx is tracing. For ``mesh["tp"]`` of a
    ``(dp=2, tp=2)`` mesh: ``{0: (0,), 1: (1,), 2: (0,), 3: (1,)}``.

    Raises:
        UnsupportedTorchError: This torch's ``DeviceMesh`` lacks the layout names.
    """
    purpose = "find a rank's coordinate on a device mesh"
    layout = required(mesh, "_layout", "DeviceMesh._layout", purpose)
    rank_map = required(mesh, "_flatten_rank_map", "DeviceMesh._flatten_rank_map", purpose)
    try:
        # torch 2.13's collapse(); torch 2.11/2.12's _MeshLayout merges its axes with
        # coalesce(), enumerating the ranks in the same (row-major) order
        flat = layout.collapse() if hasattr(layout, "collapse") else layout.coalesce()
        offsets = flat.complement(len(rank_map)).all_ranks_from_zero()
        inner = flat.all_ranks_from_zero()
        sizes = tuple(layout.top_level_sizes)
    except AttributeError as exc:
        raise unsupported("DeviceMesh._layout's collapse (or coalesce)/complement/"
                          "all_ranks_from_zero",
                          purpose) from exc
    out: dict[int, tuple[int, ...]] = {}
    for offset in offsets:
        for j, pos in enumerate(inner):
            coord, rest = [], j
            for size in reversed(sizes):
                rest, c = divmod(rest, size)
                coord.append(c)
            out[int(rank_map[offset + pos])] = tuple(reversed(coord))
    return out


#: The DeviceMesh methods that report the calling rank (``jointlab.runtime.rank_view`` sets them).
_MESH_RANK_METHODS = ("get_coordinate", "get_local_rank", "get_rank",
                      "_is_current_rank_part_of_mesh", "_sym_get_coordinate")


def mesh_rank_methods() -> tuple[str, ...]:
    """The ``DeviceMesh`` methods that answer for one rank, as jointlab patches them.

    Raises:
        UnsupportedTorchError: LocalTensorMode patches a method this list lacks
            (a torch whose meshes report the rank in a way jointlab does not know),
            or ``DeviceMesh`` lacks one of them.
    """
    from torch.distributed.device_mesh import DeviceMesh

    purpose = "make the device mesh report the rank being traced"
    unknown = set(resolve("LOCAL_TENSOR_MESH_METHODS")) - set(_MESH_RANK_METHODS)
    if unknown:
        raise unsupported(f"a DeviceMesh without rank-reporting methods {sorted(unknown)}",
                          purpose)
    for name in _MESH_RANK_METHODS:
        required(DeviceMesh, name, f"DeviceMesh.{name}", purpose)
    return _MESH_RANK_METHODS


#: torch functions that read the mesh coordinate only to size a rank's piece (membership,
#: local shard sizes, padding), the same on every rank whose DTensor state has the same
#: local shapes (a rank class). Every other coordinate read by torch may choose values
#: (which chunk a Replicate -> Shard redistribute keeps, a vocab-parallel embedding's
#: mask offset) and is recorded as a rank read.
_SIZE_ONLY_COORDINATE_READERS = {
    "_reduce_shard_tensor": "placement_types.py",  # None check; unpadding an uneven shard
    "generate_greedy_transform_infos": "_redistribute.py",  # logical shapes of uneven shards
    "_compute_local_shape_and_global_offset": "_utils.py",  # with skip_offset=True only
}


def coordinate_reader(frame: Any) -> str | None:
    """What torch's function at ``frame`` reads the mesh coordinate for, or None if only sizes.

    Args:
        frame: The Python frame that called a ``DeviceMesh`` coordinate method.

    Returns:
        None for a read that only sizes the rank's piece (see
        ``_SIZE_ONLY_COORDINATE_READERS``) or one made by DTensor's C++ dispatch (its
        caller is then not torch.distributed's Python: it asks whether the rank is in the
        mesh); otherwise ``"redistribute_local_tensor
        (Replicate() -> Shard(dim=1))"``-style text: the function, and the placements
        it converts between when its locals name them.
    """
    code = frame.f_code
    if "/torch/distributed/" not in code.co_filename.replace("\\", "/"):
        return None  # DTensor's C++ dispatch (no Python frame of its own): membership only
    file = _SIZE_ONLY_COORDINATE_READERS.get(code.co_name)
    if file and code.co_filename.endswith(f"distributed/tensor/{file}"):
        if code.co_name != "_compute_local_shape_and_global_offset":
            return None
        if frame.f_locals.get("skip_offset") is True:
            return None
    local = frame.f_locals
    what = f"{code.co_name}()"
    if "current" in local and "target" in local:
        return f"{what} ({local['current']} -> {local['target']})"
    owner = local.get("self")
    if owner is not None and not isinstance(owner, (int, str)):
        return f"{type(owner).__name__}.{what}"
    return what


def backward_node_name() -> str | None:
    """The autograd node whose backward runs now (``"RedistributeBackward"``), or None.

    Raises:
        UnsupportedTorchError: This torch has no ``torch._C._current_autograd_node``.
    """
    node = torch_attr("torch._C", "_current_autograd_node", "name the backward step "
                      "that read the mesh coordinate")()
    return None if node is None else str(node.name())


# -- FSDP2's memory tracker -------------------------------------------------------
def fsdp_mem_tracker() -> type:
    """``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker``, the FSDP2 memory tracker.

    A ``TorchDispatchMode`` that sizes the storages of one eager FSDP2 step by
    category (sharded/unsharded parameters and gradients, activations,
    temporaries, all-gather and reduce-scatter buffers, optimizer state,
    inputs); its snapshot keys are a ``str`` enum plus ``"Total"``.

    Raises:
        UnsupportedTorchError: This torch has no such module or class.
    """
    return torch_attr("torch.distributed._tools.fsdp2_mem_tracker", "FSDPMemTracker",
                      "cross-check per-rank memory against FSDP2's own memory tracker")


# -- mode='aot' with DTensor state: the gradients' subclass metadata ---------------------
_AOT_GRAD_META = "wrap the AOT graph's local gradients back into DTensors"


def aot_grad_subclass_metas(export: Any) -> list[tuple[Any, Any]]:
    """Each flat input of an AOT joint export with its gradient's subclass metadata.

    ``aot_export_joint_with_descriptors`` flattens a DTensor gradient into its
    local tensor; how to wrap it back (placements, global size and stride) is
    in the export's ``SubclassMeta.grad_input_metas``, one per flat input.

    Args:
        export: The ``JointWithDescriptors`` the export returned.

    Returns:
        ``(input descriptor, its gradient's creation metadata)`` per flat input
        (a plain tensor's metadata has no ``meta``); empty without subclass inputs.

    Raises:
        UnsupportedTorchError: This torch keeps that metadata elsewhere.
    """
    capture = required(export, "_aot_graph_capture", "JointWithDescriptors._aot_graph_capture",
                        _AOT_GRAD_META)
    state = required(export, "_aot_state", "JointWithDescriptors._aot_state", _AOT_GRAD_META)
    descs = required(state, "flat_args_descs", "AOTState.flat_args_descs", _AOT_GRAD_META)
    sub = getattr(capture, "maybe_subclass_meta", None)  # None: no subclass among the inputs
    if sub is None:
        return []
    metas = required(sub, "grad_input_metas", "SubclassMeta.grad_input_metas", _AOT_GRAD_META)
    if len(metas) != len(descs):
        raise unsupported("one SubclassMeta.grad_input_metas entry per flat input",
                          _AOT_GRAD_META)
    return list(zip(descs, metas))


def subclass_creation_parts(meta: Any) -> tuple[Any, tuple[int, ...], tuple[int, ...]] | None:
    """``(flatten context, outer size, outer stride)`` of a subclass creation metadata.

    Args:
        meta: One entry of :func:`aot_grad_subclass_metas`.

    Returns:
        What ``__tensor_unflatten__`` takes besides the inner tensors; None for
        a plain tensor's metadata.

    Raises:
        UnsupportedTorchError: It is a subclass's metadata without those fields.
    """
    if not hasattr(meta, "original_subclass_type"):
        return None
    parts = [getattr(meta, a, None) for a in ("meta", "outer_size", "outer_stride")]
    if any(p is None for p in parts):
        raise unsupported("SubclassCreationMeta.meta/outer_size/outer_stride", _AOT_GRAD_META)
    return parts[0], tuple(parts[1]), tuple(parts[2])


def opaque_real_object(obj: Any) -> Any:
    """The Python object a traced opaque constant stands for (a DTensor's ``DeviceMesh``).

    AOT lifts a mesh it meets inside the traced step (``DTensor.from_local`` in the
    forward) as a ``FakeScriptObject`` attribute of the graph module.

    Args:
        obj: That attribute's value.

    Returns:
        The real object (``FakeScriptObject.real_obj``).

    Raises:
        UnsupportedTorchError: This torch's fake script objects do not keep it.
    """
    real = getattr(obj, "real_obj", None)
    if real is None:
        raise unsupported("FakeScriptObject.real_obj", _AOT_GRAD_META)
    return real


# -- loss parallel ------------------------------------------------------------------
def _loss_module() -> Any:
    try:
        from torch.distributed.tensor.parallel import loss
    except ImportError:  # a torch without tensor parallelism: no loss parallel either
        return None
    return loss


def loss_parallel_active() -> bool:
    """True while ``torch.distributed.tensor.parallel.loss_parallel()`` is entered.

    It registers custom DTensor handlers (``customized_loss_ops``) with DTensor's
    op dispatcher; False on a torch without them.
    """
    loss = _loss_module()
    ops = getattr(loss, "customized_loss_ops", None)
    handlers = getattr(getattr(getattr(loss, "DTensor", None), "_op_dispatcher", None),
                       "_custom_op_handlers", None)
    if not isinstance(ops, dict) or not isinstance(handlers, dict):
        return False
    return any(handlers.get(op) is fn for op, fn in ops.items())


def loss_parallel_entry() -> tuple[Any, str] | None:
    """``(module, name)`` of the function ``loss_parallel()`` calls on entry, or None."""
    loss = _loss_module()
    if loss is None or not callable(getattr(loss, "_enable_custom_loss_ops", None)):
        return None
    return loss, "_enable_custom_loss_ops"


def fsdp_module_class() -> Any:
    """FSDP2's ``FSDPModule`` (what ``fully_shard`` makes a module), or None without it."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2 (or without distributed): nothing to refuse
        return None
    return FSDPModule


def clear_dtensor_caches() -> None:
    """Forget DTensor's sharding caches (C++ fast path and Python), where this torch has them.

    ``DeviceMesh`` equality ignores which rank the process is, so a sharding cached in
    one ``jl.fake_world`` handed its mesh (and that world's rank coordinate) to DTensors
    of the next world playing another rank: a graph traced as rank 1 after a world of
    rank 0 chose rank 0's chunks. Called when a simulated world opens and closes.
    """
    clear = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if callable(clear):
        clear()
    try:
        from torch.distributed.tensor import DTensor, _redistribute
    except ImportError:  # no DTensor: nothing cached
        return
    prop = getattr(getattr(DTensor, "_op_dispatcher", None), "sharding_propagator", None)
    for cached in (getattr(prop, "propagate_op_sharding", None),
                   getattr(prop, "_propagate_tensor_meta_cached", None),
                   getattr(_redistribute, "_gen_transform_infos", None)):
        if callable(getattr(cached, "cache_clear", None)):
            cached.cache_clear()
