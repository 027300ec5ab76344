"""mode='aot' with DTensor state: AOT's subclass descriptors mapped onto local shards.

``aot_export_joint_with_descriptors`` sees a DTensor parameter as it is and
flattens it with ``__tensor_flatten__`` into its parts, each a placeholder
described as ``SubclassGetAttrAOTInput(base=ParamAOTInput(fqn), attr=...)``:
the local shard (``_local_tensor``) and, in torch 2.13, the ``device_mesh`` as
an opaque script object. Each DTensor gradient comes back the same way, as
``SubclassGetAttrAOTOutput(base=GradAOTOutput(...), attr=...)`` outputs. The
DTensor ops run under DTensor dispatch while tracing, so the graph holds the
local ops and the collectives.

This module keeps the one tensor part of each DTensor (one local-shard
placeholder, one gradient output, both keeping torch's descriptors) and
removes the opaque parts, which the graph only passes through to its
outputs. The gradients' placements, global size and stride come from the
export's own subclass metadata, so :class:`AotDTensorRuntime` wraps each
local gradient back into the DTensor torch's runtime would build. Other
tensor subclasses, and parts of DTensor inputs, are refused with the routes
that work.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch import nn

from jointlab.errors import UnsupportedWrapperError
from jointlab.passes.aot_outputs import replace_outputs
from jointlab.runtime.descriptors import D, subclass_base
from jointlab.runtime.dtensor import (
    DTensorLayout,
    ShardSpec,
    dtensor_class,
    is_dtensor,
)
from jointlab.torch_compat import (
    aot_grad_subclass_metas,
    opaque_real_object,
    subclass_creation_parts,
)

__all__ = ["drop_opaque_parts", "grad_specs", "is_subclass_part",
           "refuse_subclass_state", "subclass_part_error"]

_PREFIX = "model."  # the AOT wrapper holds the model as ``self.model``


def _fqn(desc: Any) -> str:
    target = getattr(desc, "target", "")
    return target[len(_PREFIX):] if target.startswith(_PREFIX) else target


def is_opaque_part(node: fx.Node) -> bool:
    """True for a placeholder that is a non-tensor part of a subclass (DTensor's mesh)."""
    _, attrs = subclass_base(node.meta.get("desc"))
    return bool(attrs) and not isinstance(node.meta.get("val"), torch.Tensor)


def _is_opaque_constant(gm: fx.GraphModule, value: Any) -> bool:
    """True for a get_attr node holding a non-tensor constant (a mesh AOT lifted)."""
    return (isinstance(value, fx.Node) and value.op == "get_attr"
            and not isinstance(getattr(gm, value.target, None), torch.Tensor))


def drop_opaque_parts(gm: fx.GraphModule, layout: DTensorLayout, canon: dict[str, str]
                      ) -> dict[Any, Any]:
    """Remove the opaque parts of DTensor state and gradients from the graph's inputs and outputs.

    Args:
        gm: The AOT joint graph with plain positional codegen (edited in place).
        layout: The traced model's DTensor state.
        canon: Alias FQN to the FQN ``named_parameters()`` reports.

    Returns:
        Each gradient's mesh, by its ``GradAOTOutput`` descriptor: the mesh of the
        DTensor whose mesh placeholder it returned, or the mesh a lifted constant
        stands for.

    Raises:
        UnsupportedWrapperError: An opaque input is read by an op, not only returned.
    """
    opaque = [n for n in gm.graph.find_nodes(op="placeholder") if is_opaque_part(n)]
    out = gm.graph.output_node()
    for node in opaque:
        readers = [u for u in node.users if u is not out]
        if readers:
            base, attrs = subclass_base(node.meta["desc"])
            raise UnsupportedWrapperError(
                f"the AOT graph reads {attrs[-1]!r} of '{_fqn(base)}' in {readers[0].name} "
                f"({readers[0].target}); jointlab feeds only the local tensor of DTensor state. "
                "Trace with mode='make_fx' (the default), which keeps the mesh a constant.")
    mesh_of, dropped = {}, set(opaque)
    keep = []
    for value, desc in zip(out.args[0], out.meta["desc"]):
        base, attrs = subclass_base(desc)
        if value in dropped:
            fqn = canon.get(_fqn(subclass_base(value.meta["desc"])[0]), "")
            mesh_of[base] = layout.state[fqn].mesh if fqn in layout.state else None
        elif attrs and _is_opaque_constant(gm, value):
            mesh_of[base] = opaque_real_object(getattr(gm, value.target))
            dropped.add(value)
        else:
            keep.append((value, desc))
    replace_outputs(gm, ([v for v, _ in keep], *out.args[1:]), [d for _, d in keep])
    _erase_unread(gm, dropped)
    return mesh_of


def _erase_unread(gm: fx.GraphModule, nodes: set[fx.Node]) -> None:
    """Erase the dropped placeholders and constants nothing reads any more (and their attrs)."""
    for node in nodes:
        if node.users:
            continue
        target = node.target if node.op == "get_attr" else None
        gm.graph.erase_node(node)
        if target and not any(n.op == "get_attr" and n.target == target for n in gm.graph.nodes):
            delattr(gm, target)
    gm.recompile()


def grad_specs(export: Any, gm: fx.GraphModule, mesh_of: dict[Any, Any],
               canon: dict[str, str]) -> dict[str, ShardSpec]:
    """How to wrap each local gradient output back into its DTensor, by parameter FQN.

    Args:
        export: The ``JointWithDescriptors`` of the export.
        gm: Its graph, opaque parts already dropped.
        mesh_of: :func:`drop_opaque_parts`'s gradient-to-mesh map.
        canon: Alias FQN to the FQN ``named_parameters()`` reports (tied weights).

    Returns:
        A :class:`ShardSpec` per DTensor gradient (by canonical FQN), built from the
        export's subclass metadata (placements, global size and stride) and the mesh
        it returned.

    Raises:
        UnsupportedWrapperError: A gradient cannot be wrapped back, or the aliases of
            a tied DTensor get gradients of different layouts (their local tensors
            cannot be added).
    """
    metas = {_fqn(d): m for d, m in aot_grad_subclass_metas(export)
             if isinstance(d, D.ParamAOTInput)}
    out = gm.graph.output_node()
    specs = {}
    for value, desc in zip(out.args[0], out.meta["desc"]):
        base, attrs = subclass_base(desc)
        if not (attrs and isinstance(base, D.GradAOTOutput) and isinstance(value, fx.Node)):
            continue
        fqn = _fqn(base.grad_of)
        parts = subclass_creation_parts(metas.get(fqn))
        mesh = mesh_of.get(base)
        if parts is None or mesh is None:
            raise UnsupportedWrapperError(
                f"the AOT export returned the gradient of '{fqn}' as a tensor subclass part "
                "that jointlab cannot wrap back into a DTensor (no subclass metadata or mesh "
                "for it). Trace with mode='make_fx' (the default).")
        ctx, size, stride = parts
        local = torch.empty(tuple(value.meta["val"].shape), device="meta")
        whole = dtensor_class().__tensor_unflatten__(
            {attrs[0]: local, "device_mesh": mesh}, ctx, size, stride)
        spec = ShardSpec.of(canon.get(fqn, fqn), whole)
        _check_same_layout(specs.setdefault(spec.fqn, spec), spec, fqn)
    return specs


def _check_same_layout(first: ShardSpec, other: ShardSpec, alias: str) -> None:
    """Refuse alias gradients of one tied DTensor whose local tensors do not add up."""
    if (first.placements, first.local_shape, first.mesh) != (other.placements,
                                                              other.local_shape, other.mesh):
        raise UnsupportedWrapperError(
            f"the tied DTensor '{first.fqn}' gets a gradient placed {other.placements} "
            f"through its alias '{alias}' and {first.placements} through another; their "
            "local tensors cannot simply be added. Trace with mode='make_fx' (the default), "
            "where autograd sums the DTensor gradients itself.")


# -- refusals: other subclasses, and parts jointlab does not map ----------------------
_SUBCLASS_ROUTE = (
    "mode='aot' flattens each such tensor into its inner parts, which jointlab maps back "
    "only for DTensor parameters and buffers, so it refuses instead of guessing. DTensor "
    "parameters and buffers (parallelize_module, a SimpleFSDP-style parametrisation) trace "
    "in both modes (mode='make_fx', the default, or mode='aot') inside jl.fake_world(...), "
    "each as this rank's local shard. Pass inputs as plain (local) tensors.")


def is_wrapper_subclass(t: Any) -> bool:
    """True for a tensor subclass that PT2 tracing flattens (``__tensor_flatten__``)."""
    return isinstance(t, torch.Tensor) and callable(getattr(type(t), "__tensor_flatten__", None))


def inner_parts(t: torch.Tensor) -> list[str]:
    """The attributes a wrapper subclass flattens into (``_local_tensor``, ``device_mesh``)."""
    try:
        return list(t.__tensor_flatten__()[0])
    except Exception:  # a subclass whose flatten needs tracing state: name it without parts
        return []


def refuse_subclass_state(model: nn.Module) -> None:
    """Refuse mode='aot' for parameters or buffers that are tensor subclasses other than DTensor.

    Args:
        model: The model about to be traced (not changed).

    Raises:
        UnsupportedWrapperError: A parameter or buffer is a wrapper subclass that
            is not a DTensor.
    """
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if is_wrapper_subclass(t) and not is_dtensor(t):
            parts = inner_parts(t)
            raise UnsupportedWrapperError(
                f"'{name}' is a {type(t).__name__}"
                + (f" (flattened into {', '.join(parts)})" if parts else "")
                + f" and cannot be traced with mode='aot': {_SUBCLASS_ROUTE}")


def subclass_part_error(desc: Any, where: str) -> UnsupportedWrapperError:
    """The error for an AOT input or output that is one part of a tensor subclass."""
    base, attr = desc, getattr(desc, "attr", None)
    while hasattr(base, "base"):
        base = base.base
    src = getattr(base, "grad_of", base)
    what = (f"'{_fqn(src)}'" if hasattr(src, "target") else
            f"tensor input {src.idx}" if hasattr(src, "idx") else repr(src))
    part = f" ({attr!r})" if attr else ""
    return UnsupportedWrapperError(
        f"the AOT export gave an {where} that is one part{part} of {what}, a tensor "
        f"subclass such as a DTensor: {_SUBCLASS_ROUTE}")


def is_subclass_part(desc: Any) -> bool:
    """True for an AOT descriptor of one inner part of a tensor subclass (DTensor)."""
    kinds = tuple(getattr(D, k) for k in (
        "SubclassGetAttrAOTInput", "SubclassSizeAOTInput", "SubclassStrideAOTInput",
        "SubclassGetAttrAOTOutput", "SubclassSizeAOTOutput", "SubclassStrideAOTOutput")
        if hasattr(D, k))
    return isinstance(desc, kinds)
