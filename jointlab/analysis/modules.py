"""Per-module summary: parameters (tied weights once), shapes, FLOPs, bytes and time.

:func:`module_summary` gives one row per module of the model, in
``named_modules`` order, every figure covering the module *and its
submodules* (the root row is the whole model):

- ``params`` / ``trainable``: element counts of the distinct parameter tensors
  at or below the module; a tensor reachable under two names (tied
  embeddings) counts once. ``tied`` lists, for the module's own parameters,
  the other names of the same tensor (``weight=transformer.wte.weight``).
- ``out_shapes``: the shapes of the tensors the module's first call returned,
  from the trace's probes (:mod:`jointlab.trace.probe_hooks`); ``calls`` counts its calls.
- ``in_shapes``: the shapes of the tensor arguments of its first call, recorded
  by the trace's own module hooks (symbolic sizes as text in a dynamic trace).
  Nothing is run again. None for a graph loaded from disk
  (``DataFrame.attrs["in_shapes"]`` says why).
- ``flops_fwd``/``flops_bwd``/``bytes_fwd``/``bytes_bwd``: from the nodes' annotations
  (the figures of the node table, read without building it).
  ``flops_unknown_fwd``/``flops_unknown_bwd`` count the nodes whose FLOPs are
  unknown (``flops_unknown``): where not 0, the FLOPs are lower bounds.
- ``time_fwd_s``/``time_bwd_s``: from a :class:`jointlab.analysis.record.Record`
  of the same graph; NaN without one.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd
from torch import nn

from jointlab.errors import RecordError
from jointlab.meta import TRAIN_FN, info, node_info

if TYPE_CHECKING:
    from jointlab.analysis.record import Record
    from jointlab.core import TracedGraph

__all__ = ["ModuleTable", "module_summary"]

_SUMS = ("flops_fwd", "flops_bwd", "bytes_fwd", "bytes_bwd", "time_fwd_s", "time_bwd_s",
         "flops_unknown_fwd", "flops_unknown_bwd")


def _ancestors(fqn: str) -> list[str]:
    """``fqn`` and every module above it, the root ``""`` included."""
    if not fqn:
        return [""]
    parts = fqn.split(".")
    return ["", *(".".join(parts[:k]) for k in range(1, len(parts) + 1))]


def _param_columns(model: nn.Module, names: list[str]) -> dict[str, list[Any]]:
    """``params``, ``trainable`` and ``tied`` per module (tensors counted once)."""
    aliases: dict[int, list[str]] = {}
    tensors: dict[int, nn.Parameter] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
        tensors[id(p)] = p
    below: dict[str, set[int]] = {n: set() for n in names}
    for pid, fqns in aliases.items():
        for fqn in fqns:
            for anc in _ancestors(fqn.rpartition(".")[0]):
                if anc in below:
                    below[anc].add(pid)
    tied: dict[str, list[str]] = {n: [] for n in names}
    for fqns in aliases.values():
        for fqn in fqns if len(fqns) > 1 else ():
            owner, _, leaf = fqn.rpartition(".")
            if owner in tied:
                others = ", ".join(f for f in fqns if f != fqn)
                tied[owner].append(f"{leaf}={others}")
    return {
        "params": [sum(tensors[i].numel() for i in below[n]) for n in names],
        "trainable": [sum(tensors[i].numel() for i in below[n] if tensors[i].requires_grad)
                      for n in names],
        "tied": ["; ".join(tied[n]) for n in names],
    }


def _out_shapes(joint: TracedGraph) -> tuple[dict[str, list], dict]:
    """First-call output shapes and call counts per module, from the probes."""
    first: dict[str, dict[int, Any]] = {}
    calls: dict[str, set[int]] = {}
    for node in joint.graph.nodes:
        probes = info(node).get("probe_out")
        for fqn, call, leaf in probes or ():
            calls.setdefault(fqn, set()).add(call)
            if call == 0:
                first.setdefault(fqn, {})[leaf] = node_info(node).shape
    return ({m: [leaves[k] for k in sorted(leaves)] for m, leaves in first.items()},
            {m: len(c) for m, c in calls.items()})


def _in_shapes(joint: TracedGraph) -> tuple[dict[str, list], str]:
    """First-call tensor-argument shapes per module, as the trace saw them."""
    if joint.module_inputs:
        return dict(joint.module_inputs), ""
    return {}, "this graph has no recorded module inputs (loaded from disk)"


def _node_sums(joint: TracedGraph, record: Record | None, names: list[str]
               ) -> dict[str, list[float]]:
    """FLOPs, bytes (and time) of forward and backward nodes per module and below.

    Read from the nodes' annotations in one pass (the node table is not needed).
    """
    times = record.table["time_s"].to_numpy() if record is not None else None
    per: dict[tuple[str, str], list[float]] = {}
    for i, node in enumerate(joint.graph.nodes):
        m = info(node)
        phase = m.get("phase")
        if phase != "forward" and phase != "backward":
            continue
        mod = m.get("module", "")
        if mod == TRAIN_FN:  # the loss, outside the model
            continue
        acc = per.setdefault((mod, "fwd" if phase == "forward" else "bwd"), [0, 0, 0.0, 0])
        acc[0] += m.get("flops", 0)
        acc[1] += m.get("bytes", 0)
        acc[2] += times[i] if times is not None else 0.0
        acc[3] += bool(m.get("flops_unknown", False))
    out = {c: dict.fromkeys(names, 0.0) for c in _SUMS}
    for (mod, side), (flops, nbytes, secs, unknown) in per.items():
        for anc in _ancestors(mod):
            if anc in out["flops_fwd"]:
                out[f"flops_{side}"][anc] += flops
                out[f"bytes_{side}"][anc] += nbytes
                out[f"time_{side}_s"][anc] += secs
                out[f"flops_unknown_{side}"][anc] += unknown
    return {c: [out[c][n] for n in names] for c in _SUMS}


def module_summary(joint: TracedGraph, model: nn.Module, inputs: dict[str, Any] | None = None,
                   record: Record | None = None, depth: int | None = None) -> pd.DataFrame:
    """One row per module: parameters, shapes, FLOPs, bytes and time, submodules included.

    Args:
        joint: A traced joint graph of ``model``.
        model: The model (read only; no state changes).
        inputs: Unused; kept for callers of the earlier signature (input shapes now
            come from the trace itself, :attr:`TracedGraph.module_inputs`).
        record: A :func:`jointlab.record` of ``joint``, for the time columns.
        depth: Keep only modules with at most this many FQN components (0: the root).

    Returns:
        Indexed by module FQN (``""`` is the whole model): ``type, params,
        trainable, tied, calls, in_shapes, out_shapes`` and :data:`_SUMS`
        (FLOPs, bytes and unknown-FLOP node counts as ints, times in seconds).

    Raises:
        RecordError: ``depth`` is invalid or ``record`` belongs to another graph.
    """
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise RecordError(f"depth must be a non-negative int or None, got {depth!r}")
    if record is not None and (len(record.table) != len(joint.graph.nodes) or any(
            a != n.name for a, n in zip(record.table.index, joint.graph.nodes))):
        raise RecordError("this record was made on another graph (its nodes differ): "
                          "record this joint graph with jl.record(joint, model, inputs)")
    mods = [(n, m) for n, m in model.named_modules()
            if depth is None or (len(n.split(".")) if n else 0) <= depth]
    names = [n for n, _ in mods]
    outs, calls = _out_shapes(joint)
    ins, why = _in_shapes(joint)
    df = pd.DataFrame({"type": [type(m).__name__ for _, m in mods],
                       **_param_columns(model, names),
                       "calls": [calls.get(n, 0) for n in names],
                       "in_shapes": [ins.get(n) for n in names],
                       "out_shapes": [outs.get(n) for n in names],
                       **_node_sums(joint, record, names)},
                      index=pd.Index(names, name="module"))
    for c in ("flops_fwd", "flops_bwd", "bytes_fwd", "bytes_bwd", "flops_unknown_fwd",
              "flops_unknown_bwd"):
        df[c] = df[c].astype("int64")
    if record is None:
        df[["time_fwd_s", "time_bwd_s"]] = math.nan
    df.attrs["in_shapes"] = why
    return df


class ModuleTable:
    """A ``jl.module_summary`` frame that a notebook shows as the styled table.

    Reading passes through to the frame (``t.loc[...]``, ``t["params"]``,
    ``t.columns``); ``t.data`` is the DataFrame itself.

    Attributes:
        data: The DataFrame itself (unchanged).
    """

    def __init__(self, data: pd.DataFrame) -> None:
        """Wrap ``data`` (what ``jl.module_summary`` returned)."""
        self.data = data

    def __getattr__(self, name: str) -> Any:
        """Read the DataFrame through the table: ``t.loc["h.0", "params"]``, ``t.columns``."""
        if name.startswith("_") or name == "data":
            raise AttributeError(name)
        return getattr(self.data, name)

    def __getitem__(self, key: Any) -> Any:
        return self.data[key]

    def __len__(self) -> int:
        return len(self.data)

    def _repr_html_(self) -> str:
        from jointlab.display import rich_html

        return rich_html("modules", self.data)

    def __repr__(self) -> str:
        return f"ModuleTable({len(self.data)} modules)"
