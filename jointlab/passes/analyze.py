"""The cost-and-storage pass: category, FLOPs, bytes, aliasing, saved tensors.

:func:`ensure_analyzed` is a pass: it is run by :func:`jointlab.trace`, by
:func:`jointlab.load` (which marks the archived keys current) and by an
explicit :meth:`jointlab.JointGraph.recompute` after a user edits the graph.
Readers never run it; they call :func:`require_analyzed`, which raises
:class:`jointlab.errors.StaleAnalysisError` when the graph changed since.

Staleness uses public FX state only and costs O(1): the stamp holds the
generated ``graph_module.code`` string (a new object on every
``recompile()``, which ``gm.graph = ...`` also runs; a loaded graph's
``code_version`` object, see :mod:`jointlab.io.deferred`), the ``fx.Graph``
object and ``len(graph.nodes)``. An edit that neither recompiles nor adds
or removes a node leaves the module running the code the analysis describes.

Keys this pass writes into ``node.meta["jointlab"]`` (the trace-time keys of
:mod:`jointlab.passes.annotate` are listed in :mod:`jointlab.meta`):

- ``target``: readable op name, e.g. ``aten.mm``.
- ``category``: matmul, conv, pointwise, reduction, view, norm, rng, copy,
  collective or other.
- ``shape``, ``dtype``, ``numel``: of the output (multi-output: of the first).
- ``out_bytes``: size of the node's own output value(s).
- ``storage``: name of the node that allocated the storage the output lives in
  (its own name for a fresh allocation). Read from the fake tensors' storage
  identity, so views, ``getitem``, in-place ops and ``_unsafe_view`` are all exact.
- ``bytes``: what the node newly allocates: ``out_bytes`` for a fresh storage,
  0 for an alias. A multi-output node allocates nothing itself; each ``getitem``
  owns its output.
- ``is_view`` / ``alias_of``: the output shares storage with an earlier node.
- ``inplace``: the op writes one of its inputs (schema write annotation).
- ``flops``: from ``torch.utils.flop_counter``'s registry (plus the formulas a
  newer torch registers, :func:`jointlab.torch_compat.flop_formula`). Like
  torch's counter, only matmul, convolution and attention ops are counted:
  another op without a formula is 0 (pointwise, reductions, views, copies).
  ``flops_unknown``: the count is unknown (``flops`` 0 stands for it): the
  formula failed on this node, or a matmul/conv/attention op has none.
- ``saved_for_backward``: the node allocated a forward storage that the
  backward reads (through the node itself or any view or alias of it), so the
  storage stays alive from the forward into the backward: what autograd's
  saved tensors keep. Marked once per storage, on the node that owns it;
  views are never marked, and neither are parameters, buffers or inputs, nor
  storages the backward only reads sizes of (``ones_like(loss)``).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from jointlab.errors import StaleAnalysisError
from jointlab.meta import KEY, draws_random, is_aten_op, op_name, phase
from jointlab.torch_compat import flop_formula, is_collective_op, op_schema, storage_id

_STAMP = "_jointlab_analyzed"
_MATMUL = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm", "dot", "mv",
           "addmv", "addbmm", "addr", "outer"}
#: Categories whose ops torch's FLOP counter counts: one of them without a formula is unknown.
_COUNTED = {"matmul", "conv"}
_NORM_PREFIX = ("native_layer_norm", "native_batch_norm", "_native_batch_norm_legit",
                "native_group_norm", "batch_norm", "layer_norm", "group_norm", "rms_norm",
                "_fused_rms_norm", "cudnn_batch_norm")
#: Random ops are those :func:`jointlab.meta.draws_random` names (torch's own tag); these
#: higher-order ops carry no tags but run an op under a saved or fresh RNG state.
_RNG_STATE_OPS = {"philox_rand", "run_and_save_rng_state", "run_with_rng_state"}
_COPY = {"copy_", "copy", "clone", "_to_copy", "contiguous", "_copy_from", "index_put_",
         "index_put", "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones",
         "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_empty", "fill_",
         "new_full", "zero_"}
#: Ops whose output depends only on their input's sizes, dtype and device.
_METADATA_ONLY = {"ones_like", "zeros_like", "empty_like", "full_like", "rand_like",
                  "randn_like", "randint_like", "new_zeros", "new_ones", "new_empty",
                  "new_full", "new_empty_strided", "sym_size", "sym_stride", "sym_numel",
                  "sym_storage_offset"}
_REDUCTION = {"sum", "mean", "amax", "amin", "max", "min", "var", "std", "prod", "argmax",
              "argmin", "_softmax", "_log_softmax", "softmax", "log_softmax", "logsumexp",
              "var_mean", "norm", "linalg_vector_norm", "cumsum", "nll_loss_forward",
              "nll_loss2d_forward", "mse_loss", "all", "any", "_softmax_backward_data",
              "_log_softmax_backward_data", "cross_entropy_loss", "sum_to_size",
              "embedding_dense_backward"}


# -- small predicates ----------------------------------------------------------
#: A call to an ATen operator overload (the one definition is :func:`jointlab.meta.is_aten_op`).
is_op = is_aten_op


def is_getitem(node: fx.Node) -> bool:
    """True for ``operator.getitem`` on a multi-output node."""
    return node.op == "call_function" and node.target is operator.getitem


def target_name(node: fx.Node) -> str:
    """Readable target: ``aten.mm`` for ATen ops, :func:`jointlab.meta.op_name` otherwise."""
    if is_aten_op(node):
        return f"{node.target.namespace}.{op_name(node)}"
    return op_name(node)


def is_inplace(node: fx.Node) -> bool:
    """True when the op's schema says it writes one of its arguments."""
    if not is_op(node):
        return False
    return any(a.alias_info is not None and a.alias_info.is_write
               for a in op_schema(node.target).arguments)


def written_args(node: fx.Node) -> list[fx.Node]:
    """The argument nodes an in-place op writes (empty for any other node)."""
    if not is_inplace(node):
        return []
    out = []
    for i, a in enumerate(op_schema(node.target).arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        arg = node.args[i] if i < len(node.args) else node.kwargs.get(a.name)
        if isinstance(arg, fx.Node):
            out.append(arg)
    return out


def written_in_place(gm: fx.GraphModule) -> set[str]:
    """Names of the nodes whose storage some in-place op of the graph writes.

    Args:
        gm: A joint graph.

    Returns:
        Every node (views and their base alike) that shares a storage with an
        argument written in place, so a value kept for later reading must be
        copied when it is produced.

    Raises:
        StaleAnalysisError: The graph was edited since its analysis.
    """
    require_analyzed(gm)
    storage = {n.name: n.meta.get(KEY, {}).get("storage", n.name) for n in gm.graph.nodes}
    hit = {storage[a.name] for n in gm.graph.nodes for a in written_args(n)}
    return {name for name, root in storage.items() if root in hit}


def reads_metadata_only(node: fx.Node) -> bool:
    """True for an op that reads only its inputs' sizes, dtype and device (``ones_like``)."""
    return node.op == "call_function" and op_name(node) in _METADATA_ONLY


def is_forward_value(node: fx.Node) -> bool:
    """True for a value the forward computes.

    A forward node, or a ``getitem`` of a forward multi-output node even when
    the tracer created it late and tagged it backward (the ``total_weight`` of
    ``nll_loss_forward`` that only its backward reads).
    """
    if phase(node) == "forward":
        return True
    return is_getitem(node) and phase(node.args[0]) == "forward"


def saved_storages(graph: fx.Graph) -> set[str]:
    """Owners of the forward storages the backward reads (see ``saved_for_backward``).

    Args:
        graph: A joint graph whose nodes carry the ``storage`` annotation.

    Returns:
        Names of the nodes that allocated those storages.
    """
    storage = {n: n.meta.get(KEY, {}).get("storage") or n.name for n in graph.nodes}
    read: set[str] = set()
    for node in graph.nodes:
        if phase(node) != "backward" or is_forward_value(node) or reads_metadata_only(node):
            continue
        read.update(storage[a] for a in node.all_input_nodes if is_forward_value(a))
    return {n.name for n in graph.nodes
            if n.name in read and storage[n] == n.name and is_forward_value(n)}


def category(node: fx.Node) -> str:
    """Classify a node into one of the table's categories."""
    if node.op != "call_function":
        return "other"
    name = op_name(node)
    base = name.rstrip("_")
    if is_getitem(node) or (is_op(node) and node.target.is_view):
        return "view"
    if base in _MATMUL or "scaled_dot_product" in name:
        return "matmul"
    if base.startswith("convolution") or base.startswith("conv"):
        return "conv"
    if name.startswith(_NORM_PREFIX):
        return "norm"
    if draws_random(node) or name in _RNG_STATE_OPS:
        return "rng"
    if is_op(node) and is_collective_op(node.target):
        return "collective"
    if name in _COPY or base in _COPY:
        return "copy"
    if base in _REDUCTION or name in _REDUCTION:
        return "reduction"
    if is_op(node) and torch.Tag.pointwise in node.target.tags:
        return "pointwise"
    return "other"


# -- value helpers -------------------------------------------------------------
def hint(x: Any) -> int:
    """A concrete int for an int or SymInt (its trace-time hint; -1 if unknown)."""
    if isinstance(x, torch.SymInt):
        h = x.node.hint
        return int(h) if h is not None else -1
    return int(x)


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's elements (``numel × element size``)."""
    return hint(t.numel()) * t.element_size()


def tensors_of(val: Any) -> list[torch.Tensor]:
    """Tensor leaves of a node value (a tensor, or a tuple/list of them)."""
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [v for v in val if isinstance(v, torch.Tensor)]
    return []


def node_flops(node: fx.Node) -> int | None:
    """FLOPs of one ATen node from the flop-counter registry.

    Args:
        node: A graph node.

    Returns:
        The count; 0 for an op torch's counter does not count (not an ATen
        op, or no formula and not a matmul, conv or attention op); None when
        the count is unknown: the formula fails on this node, or a matmul,
        conv or attention op has no formula on this torch.
    """
    if not is_op(node):
        return 0
    fn = flop_formula(node.target.overloadpacket)
    if fn is None:
        return None if category(node) in _COUNTED else 0
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
    try:
        count = hint(fn(*args, **kwargs, out_val=node.meta.get("val")))
    except Exception:  # a formula that cannot handle these shapes: unknown, not 0
        return None
    return None if count < 0 else count


def _set_flops(node: fx.Node, meta: dict[str, Any]) -> None:
    flops = node_flops(node)
    meta["flops"], meta["flops_unknown"] = (0, True) if flops is None else (flops, False)


def recount_flops(gm: fx.GraphModule) -> None:
    """Count again, by this torch's formulas, the nodes an archive records at 0 FLOPs.

    For a graph loaded from an archive: the saving torch (or jointlab) may
    have lacked a formula and recorded 0 (CPU flash attention before 2.15).
    Known non-zero counts are kept: a loaded dynamic graph's sizes have no
    hints, so counting them again would make them unknown.

    Args:
        gm: A joint graph whose nodes carry fake ``meta["val"]``.
    """
    for node in gm.graph.nodes:
        meta = node.meta.setdefault(KEY, {})
        if meta.get("flops", 0) == 0 and not meta.get("flops_unknown", False):
            _set_flops(node, meta)


# -- the pass -------------------------------------------------------------------
def ensure_analyzed(gm: fx.GraphModule) -> None:
    """Add cost and storage keys to every node's jointlab meta (idempotent).

    A no-op while the stamp is current; see :func:`forget_analysis` to force a rerun.

    Args:
        gm: A traced joint graph whose nodes carry fake ``meta["val"]``.
    """
    if is_analyzed(gm):
        return
    owner: dict[int, str] = {}
    for node in gm.graph.nodes:
        meta = node.meta.setdefault(KEY, {})
        _analyze_node(node, meta, owner)
    mark_saved_for_backward(gm)
    mark_analyzed(gm)


def mark_saved_for_backward(gm: fx.GraphModule) -> None:
    """Write ``saved_for_backward`` per storage, on the node that allocated it.

    Part of :func:`ensure_analyzed`; also run on its own by ``jl.load`` for
    archives written before this rule (they flagged views node by node).

    Args:
        gm: A graph whose nodes already carry the storage keys.
    """
    saved = saved_storages(gm.graph)
    for node in gm.graph.nodes:
        node.meta[KEY]["saved_for_backward"] = node.name in saved


def mark_analyzed(gm: fx.GraphModule) -> None:
    """Declare the analysis keys already on ``gm``'s nodes current (e.g. loaded from disk).

    Args:
        gm: The graph module.
    """
    setattr(gm, _STAMP, graph_fingerprint(gm))


def graph_fingerprint(gm: fx.GraphModule) -> tuple[str, fx.Graph, int]:
    """An O(1) stamp of ``gm``'s current version, from public FX state only.

    Args:
        gm: The graph module.

    Returns:
        ``(generated code, graph, node count)``; compare with :func:`same_version`.
        A module that defers its code generation (``jl.load``'s) offers a
        ``code_version`` object instead, replaced on every ``recompile()``.
    """
    version = gm.__dict__.get("code_version")
    return (gm.code if version is None else version, gm.graph, len(gm.graph.nodes))


def same_version(a: tuple[str, fx.Graph, int] | None, b: tuple[str, fx.Graph, int]) -> bool:
    """True when two stamps describe the same graph version (code and graph by identity)."""
    return a is not None and a[0] is b[0] and a[1] is b[1] and a[2] == b[2]


def is_analyzed(gm: fx.GraphModule) -> bool:
    """True when the analysis keys on ``gm``'s nodes describe its current version."""
    return same_version(getattr(gm, _STAMP, None), graph_fingerprint(gm))


def require_analyzed(gm: fx.GraphModule) -> None:
    """Raise unless the analysis keys on ``gm`` are current (what every reader calls).

    Args:
        gm: The graph module a reader is about to read.

    Raises:
        StaleAnalysisError: The graph was edited (recompiled, or nodes added or
            removed) after the analysis, or was never analysed.
    """
    if is_analyzed(gm):
        return
    what = ("was edited after its analysis" if hasattr(gm, _STAMP)
            else "carries no jointlab analysis")
    raise StaleAnalysisError(
        f"the joint graph {what} ({len(gm.graph.nodes)} nodes now), so its node table, "
        "memory and plots would describe a different graph. Call joint.recompute() after "
        "editing the graph (it recompiles and refreshes the per-node analysis).")


def forget_analysis(gm: fx.GraphModule) -> None:
    """Make the next :func:`ensure_analyzed` recompute (e.g. after editing node meta).

    Args:
        gm: The graph module.
    """
    if hasattr(gm, _STAMP):
        delattr(gm, _STAMP)


_FACTS: dict[tuple[str, Any], tuple[str, str, bool]] = {}


def _target_facts(node: fx.Node) -> tuple[str, str, bool]:
    """``(target name, category, inplace)``: they depend only on op and target, so memoize."""
    key = (node.op, node.target)
    try:
        return _FACTS[key]
    except (KeyError, TypeError):  # TypeError: an unhashable target
        facts = (target_name(node), category(node), is_inplace(node))
    try:
        _FACTS[key] = facts
    except TypeError:
        pass
    return facts


def _analyze_node(node: fx.Node, meta: dict[str, Any], owner: dict[int, str]) -> None:
    val = node.meta.get("val")
    tensors = tensors_of(val)
    first = tensors[0] if tensors else None
    meta["target"], meta["category"], meta["inplace"] = _target_facts(node)
    meta["shape"] = tuple(hint(s) for s in first.shape) if first is not None else None
    meta["dtype"] = str(first.dtype).removeprefix("torch.") if first is not None else ""
    meta["numel"] = hint(first.numel()) if first is not None else 0
    meta["out_bytes"] = sum(tensor_bytes(t) for t in tensors)
    _set_flops(node, meta)
    meta["storage"], meta["alias_of"], meta["is_view"], meta["bytes"] = node.name, None, False, 0
    if isinstance(val, (list, tuple)) and not isinstance(val, torch.Tensor):
        return  # a multi-output node: each getitem owns its output
    if first is None:
        return
    sid = storage_id(first)
    root = owner.get(sid) if sid is not None else None
    # Placeholders follow the same rule: AOT mode gives tied weights one
    # placeholder per name, all on one storage, and only the first allocates.
    if root is None:
        if sid is not None:
            owner.setdefault(sid, node.name)
        meta["bytes"] = meta["out_bytes"]
        return
    meta["storage"], meta["is_view"] = root, True
    src = next((a for a in node.all_input_nodes
                if a.meta.get(KEY, {}).get("storage") == root), None)
    meta["alias_of"] = src.name if src is not None else root
