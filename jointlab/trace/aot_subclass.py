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
local gradient back into the DTensor torch's runtime would build.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from jointlab.analysis.descriptors import D, subclass_base
from jointlab.errors import UnsupportedWrapperError
from jointlab.runtime import AotRuntime
from jointlab.torch_compat import aot_grad_subclass_metas, subclass_creation_parts
from jointlab.trace.dtensor import DTensorLayout, DTensorRuntime, ShardSpec, dtensor_class

__all__ = ["AotDTensorRuntime", "drop_opaque_parts", "grad_specs"]

_PREFIX = "model."  # the AOT wrapper holds the model as ``self.model``


def _fqn(desc: Any) -> str:
    target = getattr(desc, "target", "")
    return target[len(_PREFIX):] if target.startswith(_PREFIX) else target


def is_opaque_part(node: fx.Node) -> bool:
    """True for a placeholder that is a non-tensor part of a subclass (DTensor's mesh)."""
    _, attrs = subclass_base(node.meta.get("desc"))
    return bool(attrs) and not isinstance(node.meta.get("val"), torch.Tensor)


def drop_opaque_parts(gm: fx.GraphModule) -> dict[Any, str]:
    """Remove the opaque parts of DTensor state: their placeholders and the outputs passing them.

    Args:
        gm: The AOT joint graph with plain positional codegen (edited in place).

    Returns:
        For each gradient whose mesh part was returned, the FQN of the DTensor
        that mesh placeholder came from: ``{GradAOTOutput descriptor: FQN}``.

    Raises:
        UnsupportedWrapperError: An opaque part is read by an op, not only returned.
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
    mesh_of = _gradient_meshes(out, set(opaque))
    keep = [(v, d) for v, d in zip(out.args[0], out.meta["desc"]) if v not in opaque]
    out.args = ([v for v, _ in keep], *out.args[1:])
    out.meta["desc"] = [d for _, d in keep]
    for node in opaque:
        gm.graph.erase_node(node)
    gm.recompile()
    return mesh_of


def _gradient_meshes(out: fx.Node, opaque: set[fx.Node]) -> dict[Any, str]:
    """Per gradient (its base descriptor), the FQN of the placeholder its mesh part is."""
    mesh_of = {}
    for value, desc in zip(out.args[0], out.meta["desc"]):
        if value in opaque:
            base, _ = subclass_base(desc)
            mesh_of[base] = _fqn(subclass_base(value.meta["desc"])[0])
    return mesh_of


def grad_specs(export: Any, gm: fx.GraphModule, layout: DTensorLayout,
               mesh_of: dict[Any, str]) -> dict[str, ShardSpec]:
    """How to wrap each local gradient output back into its DTensor, by parameter FQN.

    Args:
        export: The ``JointWithDescriptors`` of the export.
        gm: Its graph, opaque parts already dropped.
        layout: The traced model's DTensor state.
        mesh_of: :func:`drop_opaque_parts`'s gradient-to-mesh map.

    Returns:
        A :class:`ShardSpec` per DTensor gradient, built from the export's subclass
        metadata (placements, global size and stride) and the mesh it returned.
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
        mesh_fqn = mesh_of.get(base)
        if parts is None or mesh_fqn not in layout.state:
            raise UnsupportedWrapperError(
                f"the AOT export returned the gradient of '{fqn}' as a tensor subclass part "
                "that jointlab cannot wrap back into a DTensor (no subclass metadata or mesh "
                "for it). Trace with mode='make_fx' (the default).")
        ctx, size, stride = parts
        mesh = layout.state[mesh_fqn].mesh
        local = torch.empty(tuple(value.meta["val"].shape), device="meta")
        whole = dtensor_class().__tensor_unflatten__(
            {attrs[0]: local, "device_mesh": mesh}, ctx, size, stride)
        specs[fqn] = ShardSpec.of(fqn, whole)
    return specs


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
        return loss, wrapped, ld
