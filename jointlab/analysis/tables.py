"""The joint graph as pandas tables: one row per node, summaries, the card's numbers.

Everything here reads ``node.meta["jointlab"]`` through
:func:`jointlab.meta.node_info` (after
:func:`jointlab.passes.analyze.ensure_analyzed`) and the graph's structure; nothing
is recomputed and nothing is written back. :func:`node_table` is cached by
:attr:`jointlab.JointGraph.nodes` until the graph changes; the other functions
start from that cached table. The notebook card that shows :func:`card_facts`
is HTML and lives in :mod:`jointlab.viz.cards`.

A FLOP formula that fails on a node leaves its count unknown
(``flops_unknown``); the summaries count those nodes next to their FLOPs,
which are then lower bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from jointlab.analysis.distributed import collective_group, comm_bytes, group_dims, is_collective
from jointlab.display import render
from jointlab.errors import TableQueryError
from jointlab.meta import (
    PHASES,
    TRAIN_FN,
    did_you_mean,
    in_module,
    module_names,
    node_info,
    op_aliases,
)
from jointlab.passes.analyze import require_analyzed

if TYPE_CHECKING:
    from jointlab.core import TracedGraph

__all__ = ["COLUMNS", "HumanFrame", "ModuleSummary", "card_facts", "node_table", "select",
           "summary"]

#: Column order of :func:`node_table`; short columns first, long text last.
COLUMNS = (
    "op", "target", "phase", "module", "module_type", "shape", "dtype", "numel", "bytes",
    "is_view", "alias_of", "inplace", "flops", "flops_unknown", "category", "saved_for_backward",
    "recompute", "local_shape", "global_shape", "placement", "mesh_dim", "comm_bytes",
    "seq_nr", "num_users", "args", "stack_trace",
)
#: The distributed columns: DTensor placeholders (traced as local shards) and collectives.
DIST_COLUMNS = ("local_shape", "global_shape", "placement", "mesh_dim", "comm_bytes")
SUMMARY_BY = ("module", "phase", "op")
_COMPUTE = ("forward", "backward")
_INT_COLUMNS = ("numel", "bytes", "flops", "num_users", "comm_bytes")



# -- the node table -------------------------------------------------------------
class HumanFrame(pd.DataFrame):
    """A plain DataFrame of raw numbers whose notebook display uses human units.

    Computation sees the raw ``int64``/``float`` columns; only ``_repr_html_``
    formats (bytes as ``3 MiB``, FLOPs as ``1.2 GFLOP``, seconds as ``45 µs``,
    no number wrapped: :func:`jointlab.viz.frames.frame_html`). Slices, filters
    and joins keep the class, so ``joint.nodes[cols].head()`` displays the same way.
    """

    @property
    def _constructor(self) -> type[HumanFrame]:
        return HumanFrame

    def _repr_html_(self) -> str | None:
        return render("frame", self)


def node_table(joint: TracedGraph) -> pd.DataFrame:
    """Build the node table of ``joint`` (uncached; use ``joint.nodes``).

    Args:
        joint: A traced joint graph.

    Returns:
        One row per graph node in graph order, indexed by node name, with the
        columns in :data:`COLUMNS`.
    """
    gm = joint.graph_module
    require_analyzed(gm)
    dims = group_dims(joint)
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    names: list[str] = []
    # Bound appends keep the per-node cost to a few dict lookups.
    add = {c: cols[c].append for c in COLUMNS}
    for node in gm.graph.nodes:
        m = node_info(node)
        names.append(node.name)
        add["op"](node.op)
        add["target"](m.target)
        add["phase"](m.phase)
        add["module"](m.module)
        add["module_type"](m.module_type)
        add["shape"](m.shape)
        add["dtype"](m.dtype)
        add["numel"](m.numel)
        add["bytes"](m.bytes)
        add["is_view"](m.is_view)
        add["alias_of"](m.alias_of)
        add["inplace"](m.inplace)
        add["flops"](m.flops)
        add["flops_unknown"](m.flops_unknown)
        add["category"](m.category)
        add["saved_for_backward"](m.saved_for_backward)
        add["recompute"](m.recompute)
        for c, v in zip(DIST_COLUMNS, _dist_cells(node, dims)):
            add[c](v)
        add["seq_nr"](node.meta.get("seq_nr"))
        add["num_users"](len(node.users))
        add["args"](tuple(a.name for a in node.all_input_nodes))
        add["stack_trace"](m.source)
    data: dict[str, Any] = dict(cols)
    for c in _INT_COLUMNS:
        data[c] = pd.array(cols[c], dtype="int64")
    for c in ("is_view", "inplace", "flops_unknown", "saved_for_backward", "recompute"):
        data[c] = pd.array(cols[c], dtype="bool")
    data["seq_nr"] = pd.array(cols["seq_nr"], dtype="Int64")
    return HumanFrame(data, index=pd.Index(names, name="node"), columns=list(COLUMNS))


_NO_DIST = (None, None, "", "", 0)


def _dist_cells(node: Any, dims: dict[str, str]) -> tuple[Any, ...]:
    """local_shape, global_shape, placement, mesh_dim, comm_bytes of one node."""
    if node.op == "placeholder":
        d = node_info(node).dtensor
        if d is None:
            return _NO_DIST
        return (tuple(d["local_shape"]), tuple(d["global_shape"]), d["placement"],
                d["mesh_dim"], 0)
    if node.op == "call_function" and is_collective(node):
        group = collective_group(node)
        return None, None, "", dims.get(group, ""), comm_bytes(node)
    return _NO_DIST


def _table(joint: TracedGraph) -> pd.DataFrame:
    return joint.cached("nodes", node_table)


# -- selection --------------------------------------------------------------------
def _check_phase(phase: str | None) -> None:
    if phase is not None and phase not in PHASES:
        raise TableQueryError(f"phase must be one of {PHASES} or None, got {phase!r}")


def _check_module(module: str, modules: pd.Series, hits: pd.Series) -> None:
    """Refuse a module filter naming no module of the graph: 0 rows would look like an answer."""
    if hits.any():
        return
    names = module_names(pd.unique(modules))
    top = sorted(n for n in names if n and "." not in n and n != TRAIN_FN)
    raise TableQueryError(f"no node of the graph is in module {module!r}, so select() would "
                          f"return nothing." + did_you_mean(module, names, top))


def module_mask(modules: pd.Series, prefix: str) -> pd.Series:
    """Rows whose module is ``prefix`` or one of its submodules (:func:`jointlab.meta.in_module`).

    Args:
        modules: The ``module`` column.
        prefix: A module FQN.

    Returns:
        A boolean mask.
    """
    hits = [m for m in pd.unique(modules) if in_module(m, prefix)]
    return modules.isin(hits)


def op_mask(joint: TracedGraph, index: pd.Index, op: str) -> pd.Series:
    """Rows whose node's op is ``op`` in any spelling :func:`jointlab.meta.op_aliases` accepts.

    Args:
        joint: The traced graph the table was built from.
        index: The node table's index (node names).
        op: An op name: ``"aten.mm.default"``, ``"aten.mm"`` or ``"mm"``.

    Returns:
        A boolean mask over ``index``.
    """
    names = [n.name for n in joint.graph_module.graph.nodes if op in op_aliases(n)]
    return pd.Series(index.isin(names), index=index)


def select(joint: TracedGraph, module: str | None = None, phase: str | None = None,
           op: str | None = None) -> pd.DataFrame:
    """Filter the node table by module, phase and op (all given filters must hold).

    Args:
        joint: A traced joint graph.
        module: Module FQN; its submodules' rows (forward and backward) are included.
        phase: One of :data:`jointlab.meta.PHASES`.
        op: Target name, e.g. ``"aten.mm"`` or ``"mm"``.

    Returns:
        The matching rows of ``joint.nodes``, in graph order.

    Raises:
        TableQueryError: ``phase`` is unknown, ``module`` names no module of the
            graph (with the nearest names), or a filter is not a string.
    """
    for name, value in (("module", module), ("phase", phase), ("op", op)):
        if value is not None and not isinstance(value, str):
            raise TableQueryError(f"{name} must be a str or None, got {type(value).__name__}")
    _check_phase(phase)
    df = _table(joint)
    mask = pd.Series(True, index=df.index)
    if module is not None:
        mask &= module_mask(df["module"], module)
        _check_module(module, df["module"], mask)
    if phase is not None:
        mask &= df["phase"] == phase
    if op is not None:
        mask &= op_mask(joint, df.index, op)
    return df[mask]


# -- summaries --------------------------------------------------------------------
def truncate_module(fqn: str, depth: int | None) -> str:
    """Keep the first ``depth`` dotted components of a module FQN.

    Args:
        fqn: Module FQN; ``""`` and ``"<train_fn>"`` are returned unchanged.
        depth: Components to keep; None keeps all, 0 maps every module to the root.

    Returns:
        The truncated FQN.
    """
    if depth is None or fqn in ("", TRAIN_FN):
        return fqn
    return ".".join(fqn.split(".")[:depth])


def _saved_bytes(df: pd.DataFrame) -> pd.Series:
    """Bytes of the storages that saved forward values keep alive (views count 0)."""
    return df["bytes"].where(df["saved_for_backward"], 0)


def _side_by_side(df: pd.DataFrame, key: pd.Series) -> pd.DataFrame:
    """Counts, FLOPs and bytes of forward and backward per ``key``, plus saved bytes."""
    comp = df[df["phase"].isin(_COMPUTE)]
    key = key[comp.index]
    parts = comp.assign(key=key.values, nodes=1, saved_bytes=_saved_bytes(comp))
    wide = parts.pivot_table(index="key", columns="phase", values=["nodes", "flops", "bytes"],
                             aggfunc="sum", fill_value=0, sort=False)
    out = pd.DataFrame(index=pd.Index(pd.unique(key.values), name=key.name))
    for value in ("nodes", "flops", "bytes"):
        for ph, short in (("forward", "fwd"), ("backward", "bwd")):
            col = (value, ph)
            out[f"{value}_{short}"] = wide[col] if col in wide.columns else 0
    grouped = parts.groupby("key", sort=False)
    out["saved_bytes"] = grouped["saved_bytes"].sum()
    out["flops_unknown"] = grouped["flops_unknown"].sum()
    return out.fillna(0).astype("int64")


class ModuleSummary(HumanFrame):
    """A by-module summary: a plain DataFrame whose display names the root module.

    The index keeps the FQN ``""`` for the root module's own ops (``s.loc[""]``);
    printed, and in a notebook, that row reads ``(root) GPT2LMHeadModel``.
    """

    _metadata = ["root_type"]
    root_type = ""

    @property
    def _constructor(self) -> type[ModuleSummary]:
        return ModuleSummary

    def shown(self) -> pd.DataFrame:
        """A plain copy for display, the root row labelled ``(root) <class>``."""
        plain = pd.DataFrame(self)
        if "" not in plain.index:
            return plain
        return plain.rename(index={"": f"(root) {self.root_type}".rstrip()})

    def __repr__(self) -> str:
        return repr(self.shown())

    def _repr_html_(self) -> str | None:
        return HumanFrame(self.shown())._repr_html_()


def _module_summary(df: pd.DataFrame, key: pd.Series) -> ModuleSummary:
    out = ModuleSummary(_side_by_side(df, key))
    root = df["module_type"][(df["module"] == "") & (df["module_type"] != "")]
    out.root_type = str(root.iloc[0]) if len(root) else ""
    return out


def summary(joint: TracedGraph, by: str = "module", depth: int | None = None) -> pd.DataFrame:
    """Aggregate the node table by module, phase or op.

    Args:
        joint: A traced joint graph.
        by: ``"module"`` (modules in graph order), ``"op"`` (targets, most FLOPs
            first) or ``"phase"`` (every phase, in :data:`PHASES` order).
        depth: For ``by="module"``: keep this many FQN components (``h.0.attn``
            with depth 2 is ``h.0``).

    Returns:
        For ``module`` and ``op``: ``nodes_fwd, nodes_bwd, flops_fwd, flops_bwd,
        bytes_fwd, bytes_bwd, saved_bytes, flops_unknown`` over forward and
        backward nodes. For ``phase``: ``nodes, flops, bytes, saved_bytes,
        flops_unknown`` per phase. ``flops_unknown`` counts the nodes whose
        FLOP formula failed: where it is not 0, the FLOPs are a lower bound.
        By module, a :class:`ModuleSummary`: the root module's row keeps the
        index ``""`` and displays as ``(root) <class name>``.

    Raises:
        TableQueryError: ``by`` or ``depth`` is invalid.
    """
    if by not in SUMMARY_BY:
        raise TableQueryError(f"by must be one of {SUMMARY_BY}, got {by!r}")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise TableQueryError(f"depth must be a non-negative int or None, got {depth!r}")
    df = _table(joint)
    if by == "phase":
        return _by_phase(df)
    if by == "op":
        out = _side_by_side(df, df["target"].rename("op"))
        total = out["flops_fwd"] + out["flops_bwd"]
        nodes = out["nodes_fwd"] + out["nodes_bwd"]
        order = pd.DataFrame({"t": total, "n": nodes}).sort_values(["t", "n"], ascending=False,
                                                                   kind="stable")
        return HumanFrame(out.loc[order.index])
    key = df["module"]
    if depth is not None:
        key = key.map(lambda f: truncate_module(f, depth))
    return _module_summary(df, key.rename("module"))


def _by_phase(df: pd.DataFrame) -> pd.DataFrame:
    parts = df.assign(nodes=1, saved_bytes=_saved_bytes(df))
    cols = ["nodes", "flops", "bytes", "saved_bytes", "flops_unknown"]
    grouped = parts.groupby("phase", sort=False)[cols].sum()
    order = [p for p in PHASES if p in grouped.index]
    order += [p for p in grouped.index if p not in PHASES]
    return HumanFrame(grouped.loc[order].astype("int64"))


# -- the card's numbers --------------------------------------------------------------
def card_facts(joint: TracedGraph) -> dict[str, Any]:
    """The numbers the summary card shows, from the cached node table.

    Args:
        joint: A traced joint graph.

    Returns:
        ``mode``, ``nodes`` (total), ``phases`` (count per phase), ``params``
        (tensor count), ``param_numel``, ``flops_fwd``, ``flops_bwd``,
        ``flops_unknown_fwd`` and ``flops_unknown_bwd`` (nodes whose count is
        unknown, so the FLOPs are lower bounds), ``saved_bytes``, ``saved_count``,
        ``assumed`` (:meth:`jointlab.assumptions.Assumptions.headline`) and
        ``shape_guards`` (how many dynamic dims and size guards a dynamic trace has).
    """
    df = _table(joint)
    phase = df["phase"]
    counts = phase.value_counts()
    params = df[phase == "param"]
    saved = df["saved_for_backward"]
    return {
        "mode": str(joint.mode),
        "nodes": len(df),
        "phases": {p: int(counts.get(p, 0)) for p in PHASES},
        "params": len(params),
        "param_numel": int(params["numel"].sum()),
        "flops_fwd": int(df["flops"][phase == "forward"].sum()),
        "flops_bwd": int(df["flops"][phase == "backward"].sum()),
        "flops_unknown_fwd": int(df["flops_unknown"][phase == "forward"].sum()),
        "flops_unknown_bwd": int(df["flops_unknown"][phase == "backward"].sum()),
        "saved_bytes": int(df["bytes"][saved].sum()),
        "saved_count": int(saved.sum()),
        "assumed": joint.assumptions.headline(),
        "shape_guards": len(joint.shape_guards.rows()) if joint.shape_guards is not None else 0,
    }
