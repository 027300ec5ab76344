"""The plotly-free data of a joint-graph DAG: nodes, edges, forward twins, module groups.

:func:`graph_data` reads a traced graph into a :class:`DagData`;
:func:`keep_phases` filters it by phase and :func:`collapse` groups it by
module prefix and band. The static export takes the view's items
(:mod:`jointlab.viz._viewitems`) in this same form. Nothing here imports plotly.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jointlab import meta as _meta
from jointlab.passes.analyze import require_analyzed

__all__ = ["BACKWARD_PHASES", "DagData", "collapse", "graph_data", "keep_phases",
           "module_prefix"]

BACKWARD_PHASES = _meta.BACKWARD_PHASES  # one home: jointlab.meta


@dataclass
class DagData:
    """The nodes and edges being drawn (graph nodes, or module groups when collapsed).

    Attributes:
        names: Node (or group) names, in topological order.
        info: The jointlab meta of each node, or the aggregated facts of each group.
        src: Edge sources, as indices into ``names``.
        dst: Edge targets.
        twin: Index of the forward twin of each node, -1 if none.
        members: For groups, the graph node names inside each group.
    """

    names: list[str]
    info: list[dict[str, Any]]
    src: np.ndarray
    dst: np.ndarray
    twin: list[int]
    members: list[list[str]] = field(default_factory=list)

    @property
    def is_bwd(self) -> list[bool]:
        """Per node, whether it is drawn in the backward band."""
        return [i.get("phase") in BACKWARD_PHASES for i in self.info]


def graph_data(joint: Any) -> DagData:
    """Collect the nodes, edges and twins of a joint graph.

    Args:
        joint: A :class:`jointlab.JointGraph`.

    Returns:
        One entry per graph node.
    """
    require_analyzed(joint.graph_module)
    nodes = list(joint.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    by_name = {n.name: i for i, n in enumerate(nodes)}
    src: list[int] = []
    dst: list[int] = []
    for i, n in enumerate(nodes):
        for a in n.all_input_nodes:
            src.append(index[a])
            dst.append(i)
    info = [_meta.info(n) for n in nodes]
    twin = [by_name.get(m.get("fwd_twin"), -1) for m in info]
    return DagData([n.name for n in nodes], info, np.asarray(src, dtype=np.int64),
                   np.asarray(dst, dtype=np.int64), twin)


def keep_phases(data: DagData, phases: Any) -> DagData:
    """The nodes of ungrouped ``data`` whose phase is in ``phases``, and the edges among them.

    Args:
        data: Ungrouped data from :func:`graph_data`.
        phases: The phases to keep.

    Returns:
        The filtered data (twins re-indexed, -1 where the twin was dropped).
    """
    keep = [i for i, m in enumerate(data.info) if m.get("phase") in phases]
    new = np.full(len(data.names), -1, dtype=np.int64)
    new[keep] = np.arange(len(keep))
    both = (new[data.src] >= 0) & (new[data.dst] >= 0)
    twin = [int(new[data.twin[i]]) if data.twin[i] >= 0 else -1 for i in keep]
    return DagData([data.names[i] for i in keep], [data.info[i] for i in keep],
                   new[data.src[both]], new[data.dst[both]], twin)


def module_prefix(module: str, depth: int) -> str:
    """The first ``depth`` dotted components of a module FQN."""
    return ".".join(module.split(".")[:depth]) if depth > 0 else ""


def collapse(data: DagData, depth: int) -> DagData:
    """Group nodes by (module prefix, band): one node per module and side.

    Args:
        data: Ungrouped data from :func:`graph_data`.
        depth: Number of module FQN components kept.

    Returns:
        Group nodes whose ``info`` holds ``count``, ``flops``, ``bytes`` and
        the most frequent ops; edges between groups, without self loops.
    """
    group_of: list[int] = []
    keys: dict[tuple[str, bool], int] = {}
    for m in data.info:
        if m.get("phase") == "output":
            key = ("(output)", True)
        else:
            key = (module_prefix(m.get("module", ""), depth), m.get("phase") in BACKWARD_PHASES)
        group_of.append(keys.setdefault(key, len(keys)))
    g = np.asarray(group_of, dtype=np.int64)
    members: list[list[str]] = [[] for _ in keys]
    ops: list[Counter] = [Counter() for _ in keys]
    phases: list[Counter] = [Counter() for _ in keys]
    recomputed = np.bincount(g, [bool(m.get("recompute")) for m in data.info],
                             minlength=len(keys))
    flops = np.bincount(g, [m.get("flops", 0) for m in data.info], minlength=len(keys))
    nbytes = np.bincount(g, [m.get("bytes", 0) for m in data.info], minlength=len(keys))
    for i, m in enumerate(data.info):
        members[g[i]].append(data.names[i])
        ops[g[i]][m.get("target", "")] += 1
        phases[g[i]][m.get("phase", "")] += 1
    info = []
    for k, (mod, bwd) in enumerate(keys):
        main_phase = "output" if mod == "(output)" else "backward" if bwd else "forward"
        info.append({"phase": main_phase, "module": _meta.module_label(mod),
                     "count": len(members[k]),
                     "flops": int(flops[k]), "bytes": int(nbytes[k]), "group": True,
                     "phases": dict(phases[k]), "top_ops": ops[k].most_common(4),
                     "category": "group", "recompute": int(recomputed[k])})
    s, d = g[data.src], g[data.dst]
    keep = s != d
    pairs = np.unique(np.stack([s[keep], d[keep]], axis=1), axis=0) if keep.any() else \
        np.zeros((0, 2), dtype=np.int64)
    fwd_group = {mod: k for k, (mod, bwd) in enumerate(keys) if not bwd}
    twin = [fwd_group.get(mod, -1) if bwd else -1 for (mod, bwd) in keys]
    names = [f"{'bwd' if bwd else 'fwd'}:{_meta.module_label(mod)}" for (mod, bwd) in keys]
    return DagData(names, info, pairs[:, 0].copy(), pairs[:, 1].copy(), twin, members)
