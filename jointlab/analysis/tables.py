"""The joint graph as pandas tables: one row per node, summaries, a notebook card.

Everything here reads ``node.meta["jointlab"]`` (after
:func:`jointlab.passes.analyze.ensure_analyzed`) and the graph's structure; nothing
is recomputed and nothing is written back. :func:`node_table` is cached by
:attr:`jointlab.JointGraph.nodes` until the graph changes; the other functions
start from that cached table.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import pandas as pd

from jointlab.errors import TableQueryError
from jointlab.meta import KEY, PHASES, TRAIN_FN
from jointlab.passes.analyze import require_analyzed
from jointlab.units import human_bytes, human_count

if TYPE_CHECKING:
    from jointlab.core import TracedGraph as JointGraph

__all__ = ["COLUMNS", "node_table", "select", "summary", "summary_card_html"]

#: Column order of :func:`node_table`; short columns first, long text last.
COLUMNS = (
    "op", "target", "phase", "module", "module_type", "shape", "dtype", "numel", "bytes",
    "is_view", "alias_of", "inplace", "flops", "category", "saved_for_backward", "recompute",
    "seq_nr", "num_users", "args", "stack_trace",
)
SUMMARY_BY = ("module", "phase", "op")
_COMPUTE = ("forward", "backward")
_INT_COLUMNS = ("numel", "bytes", "flops", "num_users")



# -- the node table -------------------------------------------------------------
def node_table(joint: JointGraph) -> pd.DataFrame:
    """Build the node table of ``joint`` (uncached; use ``joint.nodes``).

    Args:
        joint: A traced joint graph.

    Returns:
        One row per graph node in graph order, indexed by node name, with the
        columns in :data:`COLUMNS`.
    """
    gm = joint.graph_module
    require_analyzed(gm)
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    names: list[str] = []
    # Bound appends keep the per-node cost to a few dict lookups.
    add = {c: cols[c].append for c in COLUMNS}
    for node in gm.graph.nodes:
        m = node.meta.get(KEY, {})
        names.append(node.name)
        add["op"](node.op)
        add["target"](m.get("target", ""))
        add["phase"](m.get("phase", ""))
        add["module"](m.get("module", ""))
        add["module_type"](m.get("module_type", ""))
        add["shape"](m.get("shape"))
        add["dtype"](m.get("dtype", ""))
        add["numel"](m.get("numel", 0))
        add["bytes"](m.get("bytes", 0))
        add["is_view"](m.get("is_view", False))
        add["alias_of"](m.get("alias_of"))
        add["inplace"](m.get("inplace", False))
        add["flops"](m.get("flops", 0))
        add["category"](m.get("category", "other"))
        add["saved_for_backward"](m.get("saved_for_backward", False))
        add["recompute"](m.get("recompute", False))
        add["seq_nr"](node.meta.get("seq_nr"))
        add["num_users"](len(node.users))
        add["args"](tuple(a.name for a in node.all_input_nodes))
        add["stack_trace"](m.get("source", ""))
    data: dict[str, Any] = dict(cols)
    for c in _INT_COLUMNS:
        data[c] = pd.array(cols[c], dtype="int64")
    for c in ("is_view", "inplace", "saved_for_backward", "recompute"):
        data[c] = pd.array(cols[c], dtype="bool")
    data["seq_nr"] = pd.array(cols["seq_nr"], dtype="Int64")
    return pd.DataFrame(data, index=pd.Index(names, name="node"), columns=list(COLUMNS))


def _table(joint: JointGraph) -> pd.DataFrame:
    return joint.cached("nodes", node_table)


# -- selection --------------------------------------------------------------------
def _check_phase(phase: str | None) -> None:
    if phase is not None and phase not in PHASES:
        raise TableQueryError(f"phase must be one of {PHASES} or None, got {phase!r}")


def module_mask(modules: pd.Series, prefix: str) -> pd.Series:
    """Rows whose module is ``prefix`` or one of its submodules.

    ``""`` (the root module) and ``"<train_fn>"`` match only themselves.

    Args:
        modules: The ``module`` column.
        prefix: A module FQN.

    Returns:
        A boolean mask.
    """
    exact = modules == prefix
    if prefix in ("", TRAIN_FN):
        return exact
    return exact | modules.str.startswith(prefix + ".")


def op_mask(targets: pd.Series, op: str) -> pd.Series:
    """Rows whose target is ``op`` (``"aten.mm"``, or just ``"mm"``).

    Args:
        targets: The ``target`` column.
        op: A target name, with or without its namespace.

    Returns:
        A boolean mask.
    """
    if "." in op:
        return targets == op
    return (targets == op) | targets.str.endswith("." + op)


def select(joint: JointGraph, module: str | None = None, phase: str | None = None,
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
        TableQueryError: ``phase`` is unknown or a filter is not a string.
    """
    for name, value in (("module", module), ("phase", phase), ("op", op)):
        if value is not None and not isinstance(value, str):
            raise TableQueryError(f"{name} must be a str or None, got {type(value).__name__}")
    _check_phase(phase)
    df = _table(joint)
    mask = pd.Series(True, index=df.index)
    if module is not None:
        mask &= module_mask(df["module"], module)
    if phase is not None:
        mask &= df["phase"] == phase
    if op is not None:
        mask &= op_mask(df["target"], op)
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
    out["saved_bytes"] = parts.groupby("key", sort=False)["saved_bytes"].sum()
    return out.fillna(0).astype("int64")


def summary(joint: JointGraph, by: str = "module", depth: int | None = None) -> pd.DataFrame:
    """Aggregate the node table by module, phase or op.

    Args:
        joint: A traced joint graph.
        by: ``"module"`` (modules in graph order), ``"op"`` (targets, most FLOPs
            first) or ``"phase"`` (every phase, in :data:`PHASES` order).
        depth: For ``by="module"``: keep this many FQN components (``h.0.attn``
            with depth 2 is ``h.0``).

    Returns:
        For ``module`` and ``op``: ``nodes_fwd, nodes_bwd, flops_fwd, flops_bwd,
        bytes_fwd, bytes_bwd, saved_bytes`` over forward and backward nodes.
        For ``phase``: ``nodes, flops, bytes, saved_bytes`` per phase.

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
        return out.loc[order.index]
    key = df["module"]
    if depth is not None:
        key = key.map(lambda f: truncate_module(f, depth))
    return _side_by_side(df, key.rename("module"))


def _by_phase(df: pd.DataFrame) -> pd.DataFrame:
    parts = df.assign(nodes=1, saved_bytes=_saved_bytes(df))
    grouped = parts.groupby("phase", sort=False)[["nodes", "flops", "bytes", "saved_bytes"]].sum()
    order = [p for p in PHASES if p in grouped.index]
    order += [p for p in grouped.index if p not in PHASES]
    return grouped.loc[order].astype("int64")


# -- notebook card ------------------------------------------------------------------
def card_facts(joint: JointGraph) -> dict[str, Any]:
    """The numbers the summary card shows, from the cached node table.

    Args:
        joint: A traced joint graph.

    Returns:
        ``mode``, ``nodes`` (total), ``phases`` (count per phase), ``params``
        (tensor count), ``param_numel``, ``flops_fwd``, ``flops_bwd``,
        ``saved_bytes``, ``saved_count``.
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
        "saved_bytes": int(df["bytes"][saved].sum()),
        "saved_count": int(saved.sum()),
    }


_CARD_STYLE = ("font-family:system-ui,sans-serif;font-size:12px;border:1px solid #ccc;"
               "border-radius:6px;padding:6px 10px;display:inline-block;line-height:1.5")


def summary_card_html(joint: JointGraph) -> str:
    """A small, fixed-size HTML card for ``JointGraph._repr_html_``.

    Args:
        joint: A traced joint graph.

    Returns:
        HTML text whose size does not grow with the graph; every string that
        comes from the model or graph is escaped.
    """
    f = card_facts(joint)
    esc = html.escape
    phases = " · ".join(f"{esc(p)} {n:,}" for p, n in f["phases"].items() if n)
    rows = [
        ("nodes", f"{f['nodes']:,} ({phases})"),
        ("parameters", f"{f['param_numel']:,} in {f['params']:,} tensors"),
        ("FLOPs", f"forward {esc(human_count(f['flops_fwd'], 'FLOP'))} · "
                  f"backward {esc(human_count(f['flops_bwd'], 'FLOP'))}"),
        ("saved for backward", f"{esc(human_bytes(f['saved_bytes']))} "
                               f"in {f['saved_count']:,} values"),
    ]
    body = "".join(f"<tr><td style='color:#666;padding-right:10px'>{k}</td><td>{v}</td></tr>"
                   for k, v in rows)
    return (f"<div class='jointlab-card' style='{_CARD_STYLE}'>"
            f"<b>JointGraph</b> <span style='color:#666'>mode={esc(f['mode'])}</span>"
            f"<table style='border-collapse:collapse'>{body}</table></div>")
