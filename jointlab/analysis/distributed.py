"""Collectives of a joint graph: one row per functional collective node.

Functional collectives (``torch.ops._c10d_functional.*``) are ordinary graph
nodes whose result is only valid after the matching ``wait_tensor``. This
reader lists them with their phase, module, process group (and mesh
dimension when a ``DeviceMesh`` is given), the bytes they produce on this
rank, and the ``wait_tensor`` that completes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
import torch.fx as fx

from jointlab import meta as _meta

if TYPE_CHECKING:
    from jointlab.core import TracedGraph

COLUMNS = ["node", "op", "phase", "module", "group", "mesh_dim", "bytes", "wait", "source"]


def is_collective(node: fx.Node) -> bool:
    """True for a functional collective node (``_c10d_functional`` op, not a wait)."""
    return (_meta.is_aten_op(node) and node.target.namespace == "_c10d_functional"
            and _meta.op_name(node) != "wait_tensor")


def _wait_of(node: fx.Node) -> str:
    return next((u.name for u in node.users if _meta.op_name(u) == "wait_tensor"), "")


def _group_name(node: fx.Node) -> str:
    names = [a for a in node.args if isinstance(a, str)]
    return names[-1] if names else ""


def _bytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    return int(sum(v.numel() * v.element_size() for v in vals if isinstance(v, torch.Tensor)))


def _mesh_dims(mesh: Any) -> dict[str, str]:
    if mesh is None:
        return {}
    names = mesh.mesh_dim_names or tuple(str(i) for i in range(mesh.ndim))
    return {mesh.get_group(i).group_name: name for i, name in enumerate(names)}


def collectives(joint: TracedGraph, mesh: Any = None) -> pd.DataFrame:
    """One row per collective: op, phase, module, group, mesh dim, bytes, its wait.

    Args:
        joint: A traced joint graph.
        mesh: Optional ``DeviceMesh``; its dimension names fill ``mesh_dim``.

    Returns:
        A DataFrame with :data:`COLUMNS`, in graph order (empty if none).
    """
    dims = _mesh_dims(mesh)
    rows = []
    for node in joint.graph.nodes:
        if not is_collective(node):
            continue
        info = _meta.info(node)
        group = _group_name(node)
        rows.append([node.name, _meta.op_name(node), info.get("phase", ""),
                     info.get("module", ""), group, dims.get(group, ""), _bytes(node),
                     _wait_of(node), info.get("source", "")])
    return pd.DataFrame(rows, columns=COLUMNS)
