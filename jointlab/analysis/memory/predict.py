"""Memory of one training step, predicted from the joint graph (and measured).

Every node of the joint graph is one *step*. A storage is born at the step of
the node that allocates it and dies at the step after which no variable of
the generated code refers to it any more. The rules mirror
``fx.Graph``'s code generation, which emits ``x = None`` right after a value's
last use:

- placeholders (state and inputs) are held by the caller for the whole run;
- ``get_attr`` constants belong to the module and also live the whole run;
- graph outputs live to the end;
- a value with no users is dropped right after its own step;
- a storage dies when its last alias (view, in-place result, ``getitem``, the
  multi-output tuple that holds it) dies;
- outputs of a multi-output op that no ``getitem`` reads live as long as the
  tuple.

Storage identity (owner, bytes, views, in-place) comes from
:func:`jointlab.passes.analyze.ensure_analyzed`. ``live bytes`` at a step counts
every storage with ``first_step <= step <= last_step``: while a node runs,
its inputs and its new outputs are alive together, which is the step's peak.

:func:`predict` returns a :class:`~jointlab.analysis.memory.result.MemoryProfile`;
``joint.memory()`` (:mod:`jointlab.analysis.memory.profile`) adds the measured
columns and the what-if hand-off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.fx as fx

from jointlab.analysis.memory.result import CATEGORIES, MemoryProfile
from jointlab.analysis.memory.sizes import Sizes, round_alloc, traced_sizes
from jointlab.meta import NodeInfo, is_aten_op, node_info, op_name
from jointlab.passes.analyze import is_getitem, require_analyzed, tensor_bytes
from jointlab.torch_compat import op_schema

__all__ = ["CATEGORIES", "MemoryProfile", "predict", "storages"]

# Loss kernels that allocate their result like the unreduced loss, then reduce into it:
# the 0-d output keeps an input-sized storage (checked on torch 2.13, CPU).
_REDUCES_INTO_FULL_BUFFER = {"mse_loss", "smooth_l1_loss", "binary_cross_entropy",
                             "soft_margin_loss"}


# -- small predicates ------------------------------------------------------------
def lives_whole_run(node: fx.Node) -> bool:
    """True for values the caller or the module holds for the whole run."""
    return node.op in ("placeholder", "get_attr")


def is_multi_output(node: fx.Node) -> bool:
    """True for a node whose value is a tuple/list read through ``getitem``."""
    val = node.meta.get("val")
    return isinstance(val, (list, tuple)) and node.op == "call_function"


def has_tensor(node: fx.Node) -> bool:
    """True when the node's value (or first output) is a tensor."""
    return node_info(node).shape is not None


def reduction_arg(node: fx.Node) -> int:
    """The ``reduction`` argument of a loss op (1 = mean when not given)."""
    names = [a.name for a in op_schema(node.target).arguments]
    k = names.index("reduction")
    if "reduction" in node.kwargs:
        return int(node.kwargs["reduction"])
    return int(node.args[k]) if k < len(node.args) else 1


def reduces_into_full_buffer(node: fx.Node) -> bool:
    """True for a reducing loss op whose output storage is input-sized."""
    return (is_aten_op(node) and op_name(node) in _REDUCES_INTO_FULL_BUFFER
            and reduction_arg(node) != 0)


def may_reduce_into_full_buffer(m: NodeInfo) -> bool:
    """Cheap necessary condition for :func:`reduces_into_full_buffer` (``aten.<op>`` target)."""
    return m.target.rsplit(".", 1)[-1] in _REDUCES_INTO_FULL_BUFFER


def alloc_bytes(node: fx.Node, sizes: Sizes | None = None, m: NodeInfo | None = None) -> int:
    """Bytes the node's fresh storage really takes.

    That is ``bytes`` from the analysis, widened for kernels known to over-allocate
    and for DTensor shards torch keeps in padded storage (the ``storage_bytes``
    the trace recorded).

    Args:
        node: A node of an analyzed graph.
        sizes: Evaluate symbolic sizes at these input sizes (default: trace-time hints).
        m: The node's :func:`~jointlab.meta.node_info`, when the caller has it.

    Returns:
        Bytes; 0 for a node that allocates nothing (an alias).
    """
    m = node_info(node) if m is None else m
    nbytes = int(m.bytes)
    if nbytes and sizes is not None:
        nbytes = sizes.out_bytes(node)
    if node.op == "placeholder":  # a DTensor shard torch keeps in padded storage
        nbytes = max(nbytes, int((m.dtensor or {}).get("storage_bytes", 0)))
    size_of = tensor_bytes if sizes is None else sizes.tensor_bytes
    if nbytes and may_reduce_into_full_buffer(m) and reduces_into_full_buffer(node):
        src = node.args[0].meta.get("val")
        nbytes = max(nbytes, size_of(src) // src.element_size()
                     * node.meta["val"].element_size())
    return nbytes


# -- liveness ----------------------------------------------------------------------
def variable_deaths(nodes: list[fx.Node]) -> dict[fx.Node, int]:
    """Step after which the generated code drops each node's variable.

    Args:
        nodes: The graph's nodes in order.

    Returns:
        Node -> last step at which its value is still referenced.
    """
    end = len(nodes) - 1
    death: dict[fx.Node, int] = {}
    for i, node in enumerate(nodes):
        death[node] = end if lives_whole_run(node) else i
        for a in node.all_input_nodes:
            if not lives_whole_run(a):
                death[a] = i
    return death


def born_at(node: fx.Node, index: dict[fx.Node, int]) -> int:
    """Step that allocates a node's fresh storage: a ``getitem``'s op allocated it."""
    if is_getitem(node) and isinstance(node.args[0], fx.Node):
        return index[node.args[0]]
    return index[node]


@dataclass
class _Storage:
    owner: str
    birth: int
    death: int
    nbytes: int
    aliases: int = 0
    saved: bool = False
    grad: bool = False
    output: bool = False


def _unread_outputs(node: fx.Node, sizes: Sizes | None = None) -> list[tuple[int, int]]:
    """(index, bytes) of fresh outputs of a multi-output op that no getitem reads."""
    read = {u.args[1] for u in node.users if is_getitem(u)}
    returns = op_schema(node.target).returns if is_aten_op(node) else None
    out = []
    for i, t in enumerate(node.meta["val"]):
        if i in read or not isinstance(t, torch.Tensor):
            continue
        if returns is not None and i < len(returns) and returns[i].alias_info is not None:
            continue
        out.append((i, tensor_bytes(t) if sizes is None else sizes.tensor_bytes(t)))
    return out


def _is_wait_tensor(node: fx.Node) -> bool:
    return (node.op == "call_function" and "wait_tensor" in str(node.target)
            and bool(node.args) and isinstance(node.args[0], fx.Node))


def node_infos(joint_or_gm: Any) -> dict[fx.Node, NodeInfo]:
    """Every node's :class:`~jointlab.meta.NodeInfo`, in graph order (read once per node).

    Args:
        joint_or_gm: A traced joint graph or an analyzed GraphModule.

    Returns:
        Node -> its annotations.
    """
    gm = getattr(joint_or_gm, "graph_module", joint_or_gm)
    require_analyzed(gm)
    return {n: node_info(n) for n in gm.graph.nodes}


def storages(joint_or_gm: Any, device: str = "cpu", sizes: Sizes | None = None,
             infos: dict[fx.Node, NodeInfo] | None = None
             ) -> tuple[list[fx.Node], dict[str, _Storage]]:
    """Every storage of one run with its birth step, death step and size.

    Args:
        joint_or_gm: A traced joint graph or a GraphModule with fake ``meta["val"]``.
        device: Device whose allocator rounding to apply (``cuda`` rounds to 512 B).
        sizes: Sizes of a dynamic graph at a call's inputs (default: as traced).
        infos: :func:`node_infos` of the graph, when the caller has them.

    Returns:
        ``(nodes, {owner name: storage})``.
    """
    infos = node_infos(joint_or_gm) if infos is None else infos
    nodes = list(infos)
    death = variable_deaths(nodes)
    index = {n: i for i, n in enumerate(nodes)}
    out_node = nodes[-1]
    outputs = set(out_node.all_input_nodes) if out_node.op == "output" else set()
    st: dict[str, _Storage] = {}
    waited: dict[str, str] = {}  # a wait_tensor's storage -> the collective's
    for i, node in enumerate(nodes):
        m = infos[node]
        if is_multi_output(node):
            for k, nb in _unread_outputs(node, sizes):
                st[f"{node.name}[{k}]"] = _Storage(f"{node.name}[{k}]", i, death[node],
                                                   round_alloc(nb, device), 1)
            continue
        if m.shape is None:  # no tensor value
            continue
        owner = m.storage or node.name
        if _is_wait_tensor(node):  # returns the collective's own buffer: an alias
            src = infos[node.args[0]].storage or node.args[0].name
            waited[owner] = waited.get(src, src)
        owner = waited.get(owner, owner)
        s = st.get(owner)
        if s is None:
            birth = 0 if lives_whole_run(node) else born_at(node, index)
            s = st[owner] = _Storage(owner, birth, death[node],
                                     round_alloc(alloc_bytes(node, sizes, m), device))
        d = death[node]
        if is_getitem(node):
            d = max(d, death[node.args[0]])
        s.death = max(s.death, d)
        s.aliases += 1
        s.saved = s.saved or m.saved_for_backward
        if node in outputs:
            s.death = len(nodes) - 1
            s.output = True
            s.grad = s.grad or m.grad_of is not None
    return nodes, st


def storage_category(s: _Storage, owner: fx.Node | None, m: NodeInfo | None = None) -> str:
    """One of :data:`CATEGORIES` for a storage (``m``: the owner's node_info, if known)."""
    ph = (node_info(owner) if m is None else m).phase if owner is not None else ""
    if owner is not None and owner.op == "get_attr":
        return "buffer"
    if ph in ("param", "buffer", "input"):
        return ph
    if s.grad:
        return "gradient"
    if s.output:
        return "output"
    if ph == "forward" and s.saved:
        return "activation"
    return "temporary"


# -- the tables -------------------------------------------------------------------
def _shape(node: fx.Node, sizes: Sizes | None, m: NodeInfo) -> Any:
    if sizes is None:
        return m.shape
    return sizes.shape(node)


def lifetimes_table(nodes: list[fx.Node], st: dict[str, _Storage],
                    sizes: Sizes | None = None,
                    infos: dict[fx.Node, NodeInfo] | None = None) -> pd.DataFrame:
    """One row per storage (see :attr:`MemoryProfile.lifetimes`)."""
    infos = {n: node_info(n) for n in nodes} if infos is None else infos
    by_name = {n.name: n for n in nodes}
    filled = filled_by(nodes, infos)
    rows = []
    blank = NodeInfo()
    for s in st.values():
        base = s.owner.split("[", 1)[0]
        node = by_name.get(base)
        m = infos[node] if node is not None else blank
        rows.append((s.owner, m.target, m.module, storage_category(s, node, m), m.phase,
                     s.birth, s.death, s.nbytes,
                     str(_shape(node, sizes, m)) if s.owner == base else "", m.dtype, s.aliases,
                     filled.get(s.owner, "")))
    cols = ["storage", "op", "module", "category", "phase", "first_step", "last_step",
            "bytes", "shape", "dtype", "aliases", "filled_by"]
    return pd.DataFrame(rows, columns=cols)


_UNINITIALISED = {"aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty",
                  "aten.new_empty_strided"}


def filled_by(nodes: list[fx.Node], infos: dict[fx.Node, NodeInfo] | None = None
              ) -> dict[str, str]:
    """The op that first writes each storage allocated uninitialised (``empty_like``).

    Args:
        nodes: The graph's nodes in order.
        infos: Their :func:`~jointlab.meta.node_info` (read here when None).

    Returns:
        Owner name -> target of its first in-place writer (``aten.bernoulli_``
        for the dropout mask CPU eager draws into an ``empty_like``).
    """
    infos = {n: node_info(n) for n in nodes} if infos is None else infos
    owners = {n.name for n in nodes if infos[n].target in _UNINITIALISED}
    out: dict[str, str] = {}
    if not owners:
        return out
    for n in nodes:
        m = infos[n]
        if m.inplace and m.storage in owners:
            out.setdefault(m.storage, m.target)
    return out


def timeline_table(nodes: list[fx.Node], life: pd.DataFrame,
                   sizes: Sizes | None = None,
                   infos: dict[fx.Node, NodeInfo] | None = None) -> pd.DataFrame:
    """Live bytes per category at every step (see :attr:`MemoryProfile.timeline`)."""
    n = len(nodes)
    by_node = {x: node_info(x) for x in nodes} if infos is None else infos
    infos = [by_node[x] for x in nodes]
    data: dict[str, Any] = {
        "node": [x.name for x in nodes],
        "op": [m.target or x.op for x, m in zip(nodes, infos)],
        "module": [m.module for m in infos],
        "phase": [m.phase for m in infos],
        "shape": [str(_shape(x, sizes, m) or "") for x, m in zip(nodes, infos)],
    }
    births = life["first_step"].to_numpy()
    deaths = life["last_step"].to_numpy()
    nbytes = life["bytes"].to_numpy(dtype=np.int64)
    cats = life["category"].to_numpy()
    total = np.zeros(n, dtype=np.int64)
    for c in CATEGORIES:
        sel = cats == c
        diff = np.zeros(n + 1, dtype=np.int64)
        np.add.at(diff, births[sel], nbytes[sel])
        np.add.at(diff, deaths[sel] + 1, -nbytes[sel])
        data[c] = np.cumsum(diff[:n])
        total += data[c]
    data["total"] = total
    df = pd.DataFrame(data)
    df.index.name = "step"
    return df


def predict(joint_or_gm: Any, device: str = "cpu", name: str = "",
            sizes: Sizes | None = None) -> MemoryProfile:
    """Predict the memory of one run of a joint graph from its annotations.

    Args:
        joint_or_gm: A traced joint graph (or a GraphModule with fake values).
        device: Device whose allocator rounding to model.
        name: Label for the HTML card.
        sizes: For a dynamic graph, the sizes to predict at (default: the traced ones).

    Returns:
        A :class:`MemoryProfile` without measured columns (and without the
        what-if hand-off, which ``joint.memory()`` binds).
    """
    infos = node_infos(joint_or_gm)
    nodes, st = storages(joint_or_gm, device, sizes, infos)
    life = lifetimes_table(nodes, st, sizes, infos)
    tl = timeline_table(nodes, life, sizes, infos)
    total = tl["total"].to_numpy()
    phases = tl["phase"].to_numpy()
    bwd = np.flatnonzero(phases == "backward")
    boundary = int(bwd[0]) if len(bwd) else len(nodes)
    peak = int(total.argmax()) if len(total) else 0
    return MemoryProfile(
        lifetimes=life, timeline=tl, peak_bytes=int(total.max(initial=0)),
        peak_node=nodes[peak].name if nodes else "",
        forward_peak_bytes=int(total[:boundary].max(initial=0)),
        backward_peak_bytes=int(total[boundary:].max(initial=0)),
        boundary_step=boundary, device=device, name=name,
        input_sizes=_input_sizes(joint_or_gm, sizes))


def _input_sizes(joint_or_gm: Any, sizes: Sizes | None) -> dict[str, tuple[int, ...]]:
    if sizes is not None:
        return dict(sizes.inputs)
    if not hasattr(joint_or_gm, "graph_module"):
        return {}
    return traced_sizes(joint_or_gm)
