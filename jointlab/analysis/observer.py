"""The observer behind ``jl.record``: an instrumented copy of the joint graph.

:func:`instrument` copies the joint graph and calls a :class:`ValueObserver`
after its nodes. Per node the observer keeps the value's shape and dtype, the
statistics of :mod:`jointlab.analysis.value_stats`, the node's wall time, and
optionally a clone of the value within a byte budget. The user's graph is
never edited.

What is decided once per graph (:class:`Plan`), not once per node and step:

- A view, or another op that only rearranges its argument (``SAME_VALUES``, and
  ``expand``), or the ``neg`` of a floating value (negation rounds nothing),
  whose argument no in-place op can have written since it ran (no node whose
  schema mutates lies between them), and whose shape and dtype the trace fixed,
  is *derived*: the instrumented graph only stamps the time after
  it, and its row is its argument's statistics, scaled for ``expand``, after
  the step. A view read after an in-place op is observed and, when its storage
  was written since its argument ran, described from its own value.
- Which nodes write in place (their schema says so), which may be an attention
  mask and which add a mask to scores (:mod:`jointlab.analysis.attention_masks`).

Times come from one list of clock marks: each observed node appends the
moment its op ended and the moment the observer returned, each derived node the
moment it ended, so a node's time is its end mark minus the mark before it and
never includes the observer's own work.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from jointlab.analysis.attention_masks import mask_nodes, mask_sums
from jointlab.analysis.value_stats import (
    NAN_ROW,
    SAME_VALUES,
    dtype_name,
    negated_stats,
    repeated_stats,
    tensor_stats,
    why_not,
)
from jointlab.meta import is_aten_op, op_name
from jointlab.torch_compat import graph_codegen, op_schema

if TYPE_CHECKING:
    import pandas as pd

    from jointlab.core import TracedGraph

__all__ = ["ObservedStep", "Plan", "ValueObserver", "instrument"]

#: Ops whose output holds no defined values until something writes into it.
_UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                            "new_empty_strided", "empty_permuted"})
#: Ops whose output repeats (``expand``) or rearranges its first argument's values.
_REUSES = SAME_VALUES | {"expand"}
_STRIDED = torch.strided
_NOT_RUN = (None, "", *NAN_ROW, None, None, False, "not run")


@dataclass(frozen=True)
class Plan:
    """What the instrumented graph does at each node, decided once per graph.

    Attributes:
        mutates: Per node: whether its schema writes into an input.
        same_as: Per node: the index of the node whose values it rearranges, or -1.
        derived: Per node: the index of the node its row is derived from after
            the step (a view no in-place op can have changed, or the ``neg``
            of a floating value), or -1.
        static: Per derived node: its traced shape, dtype name and element count.
        uninitialized: Per node: whether its op leaves memory undefined (``empty*``).
        maskable: Per node: whether its ``-inf`` may be an attention mask.
        mask_sum: Per node: the mask it adds to scores, or -1.
        is_source: Per node: whether an observed view may reuse its statistics
            (only these stamp their storage).
        end_mark: Per node: the index of the clock mark taken when it ended, or
            -1 (the output node).
        derived_order: The derived nodes' indices in graph order.
        negated: The derived nodes whose values are their argument's negated.
    """

    mutates: list[bool]
    same_as: list[int]
    derived: list[int]
    static: dict[int, tuple[tuple[int, ...], str, int]]
    uninitialized: list[bool]
    maskable: list[bool]
    mask_sum: list[int]
    is_source: list[bool]
    end_mark: list[int]
    derived_order: tuple[int, ...]
    negated: frozenset[int]


def make_plan(nodes: list[fx.Node], derive: bool) -> Plan:
    """The :class:`Plan` of ``nodes``; ``derive=False`` observes every node (values kept)."""
    index = {n: i for i, n in enumerate(nodes)}
    mutates = [_is_mutating(n) for n in nodes]
    same_as = [index[n.args[0]] if op_name(n) in _REUSES and n.args
               and isinstance(n.args[0], fx.Node) else -1 for n in nodes]
    uninitialized = [op_name(n) in _UNINITIALIZED for n in nodes]
    maskable = mask_nodes(nodes)
    mask_sum = mask_sums(nodes, maskable)
    derived = [-1] * len(nodes)
    static: dict[int, tuple[tuple[int, ...], str, int]] = {}
    negated = {i for i, n in enumerate(nodes) if _is_float_neg(n)}
    last_write = -1  # position of the last node that writes in place
    for i, node in enumerate(nodes):
        if mutates[i]:
            last_write = i
        src = index[node.args[0]] if i in negated else same_as[i]
        if not derive or src < 0 or last_write > src or maskable[i] or mask_sum[i] >= 0:
            continue
        mine, theirs = _static_tensor(node), _static_tensor(nodes[src])
        if mine and theirs and not uninitialized[src]:  # src's value will be described
            derived[i], static[i] = src, mine
    is_source = [False] * len(nodes)
    for i, src in enumerate(same_as):
        if src >= 0 and derived[i] < 0:
            is_source[src] = True
    return Plan(mutates, same_as, derived, static, uninitialized, maskable, mask_sum, is_source,
                _end_marks(nodes, derived), tuple(i for i, s in enumerate(derived) if s >= 0),
                frozenset(i for i in negated if derived[i] >= 0))


def _is_float_neg(node: fx.Node) -> bool:
    """``aten.neg`` of one floating tensor node: its values, negated exactly (no rounding)."""
    val = node.meta.get("val")
    return (node.op == "call_function" and op_name(node) == "neg" and len(node.args) == 1
            and isinstance(node.args[0], fx.Node) and not node.kwargs
            and isinstance(val, torch.Tensor) and val.dtype.is_floating_point)


def _static_tensor(node: fx.Node) -> tuple[tuple[int, ...], str, int] | None:
    """``(shape, dtype name, numel)`` when the trace fixed them and the value gets statistics."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or type(val.numel()) is not int:
        return None
    shape = tuple(val.shape)
    if (not all(type(d) is int for d in shape) or val.layout is not _STRIDED or val.is_complex()
            or val.is_quantized or val.numel() == 0):
        return None
    return shape, dtype_name(val.dtype), val.numel()


def _end_marks(nodes: list[fx.Node], derived: list[int]) -> list[int]:
    """Per node, the index of its end mark (see the module docstring), in run order.

    Mark 0 is the run's start; placeholders are observed together after the last one.
    """
    out = [-1] * len(nodes)
    k = 1
    order = [i for i, n in enumerate(nodes) if n.op == "placeholder"]
    order += [i for i, n in enumerate(nodes) if n.op not in ("placeholder", "output")]
    for i in order:
        out[i] = k
        k += 1 if derived[i] >= 0 else 2
    return out


class ValueObserver:
    """The observer the instrumented graph calls after each node (see the module docstring)."""

    def __init__(self, nodes: list[fx.Node], derive: bool = True) -> None:
        self.nodes = nodes
        self.plan = make_plan(nodes, derive)
        #: The record table's index: the node names in graph order. pandas is imported here,
        #: not with the module: the stepper panel's first view needs describe() only.
        import pandas as pd

        self.index = pd.Index([n.name for n in nodes], name="node")
        #: Per clock mark: the node that took it (-1: the run's start).
        self._mark_owner = [-1] * (max(self.plan.end_mark) + 2)
        for i, k in enumerate(self.plan.end_mark):
            if k >= 0:
                for j in range(k, k + (1 if self.plan.derived[i] >= 0 else 2)):
                    self._mark_owner[j] = i
        #: Per derived node: the shape and dtype the trace gave its value.
        self._derived_meta = {i: (self.plan.static[i][0], nodes[i].meta["val"].dtype)
                              for i in self.plan.derived_order}
        self.reset(0)

    def reset(self, keep_bytes: int) -> None:
        """Forget the last step; keep clones of values within ``keep_bytes`` bytes."""
        n = len(self.nodes)
        #: Per node: its row of statistics (None until it runs).
        self.rows: list[tuple[Any, ...] | None] = [None] * n
        self.values: dict[str, torch.Tensor] = {}
        self.budget = keep_bytes
        #: Per node: its value's infinities are all -inf and it is an attention mask.
        self.mask = [False] * n
        #: Per storage (its data pointer): how many in-place ops wrote into it so far.
        self.writes: dict[int, int] = {}
        #: Per source node: its value's storage and that storage's write count when it ran.
        self.stamp: dict[int, tuple[int, int]] = {}
        self.numel: dict[int, int] = {}
        self.marks: list[float] = []

    def start(self) -> None:
        """Take the run's first clock mark (call right before the instrumented graph)."""
        self.marks = [perf_counter()]

    def stamp_end(self, i: int, value: Any) -> None:
        """Derived node ``i`` ended: mark the time.

        Its shape and dtype are checked against the trace's (a node edited after
        the trace may differ); a value that differs is described on the spot,
        its time then including that.
        """
        shape, dtype = self._derived_meta[i]
        if type(value) is not torch.Tensor or value.shape != shape or value.dtype is not dtype:
            self.rows[i] = self._tensor_row(i, value) if isinstance(value, torch.Tensor) else (
                None, type(value).__name__, *NAN_ROW, None, None, False, "not a tensor")
        self.marks.append(perf_counter())

    @property
    def last_done(self) -> int:
        """The index of the last node that finished, or -1."""
        k = len(self.marks) - 1
        return self._mark_owner[k] if 0 <= k < len(self._mark_owner) else -1

    def observe(self, i: int, value: Any, *written: Any) -> None:
        """Record node ``i``'s value.

        ``written`` are the inputs of an op whose schema mutates: their storages
        count as written (all of them, to be safe).
        """
        if isinstance(value, torch.Tensor):
            if value.is_cuda:
                torch.cuda.synchronize(value.device)
            self.marks.append(perf_counter())
            if written:
                self._count_writes(written)
            row = self.rows[i] = self._tensor_row(i, value)
            if row[8] and row[7] == 0 and (self.plan.maskable[i] or self.plan.mask_sum[i] >= 0):
                self.mask[i] = self._is_mask(i, value, row)
        else:
            self.marks.append(perf_counter())
            if written:
                self._count_writes(written)
            self.rows[i] = (None, type(value).__name__, *NAN_ROW, None, None, False,
                            "not a tensor")
        self.marks.append(perf_counter())

    def _count_writes(self, written: tuple[Any, ...]) -> None:
        for t in written:
            if isinstance(t, torch.Tensor):
                ptr = t.untyped_storage().data_ptr()
                self.writes[ptr] = self.writes.get(ptr, 0) + 1

    def _unchanged(self, src: int) -> bool:
        """Whether node ``src``'s storage saw no in-place write since ``src`` ran."""
        stamp = self.stamp.get(src)
        return stamp is not None and self.writes.get(stamp[0], 0) == stamp[1] and not (
            self.rows[src][-1])  # type: ignore[index]

    def _tensor_row(self, i: int, value: torch.Tensor) -> tuple[Any, ...]:
        plan, numel = self.plan, value.numel()
        if (numel and value.layout is _STRIDED and not value.is_complex()
                and not value.is_quantized and not plan.uninitialized[i]):
            note = ""
            src = plan.same_as[i]
            if src >= 0 and self._unchanged(src):
                # same values (or repeated, for expand) as a node whose value is unchanged since
                stats, nan, inf = repeated_stats(self.rows[src], numel / self.numel[src])
            else:
                stats, nan, inf = tensor_stats(value)
        else:
            note = why_not(value, plan.uninitialized[i])
            stats, nan, inf = NAN_ROW, None, None
        kept = False
        if self.budget:
            kept = 0 < value.nbytes <= self.budget
            if kept:
                self.values[self.nodes[i].name] = value.detach().clone()
                self.budget -= value.nbytes
        if plan.is_source[i]:
            self.numel[i] = numel
            ptr = value.untyped_storage().data_ptr()
            self.stamp[i] = (ptr, self.writes.get(ptr, 0))
        dtype = dtype_name(value.dtype)
        return (tuple(value.shape), dtype, *stats, nan, inf, kept, note)

    def _is_mask(self, i: int, value: torch.Tensor, row: tuple[Any, ...]) -> bool:
        """Whether node ``i``'s infinities (no NaN) are an attention mask's -inf."""
        neg = int((value == -math.inf).sum())
        if neg != row[8]:  # a +inf is no mask
            return False
        j = self.plan.mask_sum[i]
        if j < 0:
            return True
        # scores + mask: exactly the mask's -inf, broadcast to the sum's shape
        src = self.rows[j]
        return bool(src and src[8] is not None and src[0] is not None
                    and src[8] * value.numel() == neg * math.prod(src[0]) and self.mask[j])

    def take(self) -> ObservedStep:
        """What the last step observed.

        The step keeps these lists: :meth:`reset` and :meth:`start` give the
        observer new ones.
        """
        return ObservedStep(self.index, self.rows, self.marks, self.mask, self.plan)


@dataclass(frozen=True, eq=False)
class ObservedStep:
    """What one instrumented step observed, before it is laid out as a table.

    Attributes:
        index: The node names in graph order.
        rows: Per observed node its row of statistics; None for derived nodes
            and nodes that did not run.
        marks: The clock marks (see the module docstring).
        mask: Per node: whether its value's infinities are an attention mask's -inf.
        plan: The graph's :class:`Plan`.
    """

    index: pd.Index
    rows: list[tuple[Any, ...] | None]
    marks: list[float]
    mask: list[bool]
    plan: Plan

    @functools.cached_property
    def finished(self) -> tuple[list[tuple[Any, ...]], list[float]]:
        """Every node's row (derived ones filled in, ``not run`` ones marked) and time.

        Returns:
            ``(rows, times)``: one row per node and its wall time (NaN when it did not run).
        """
        plan, rows, done = self.plan, list(self.rows), len(self.marks)
        static, derived, end_mark = plan.static, plan.derived, plan.end_mark
        for i in plan.derived_order:
            src = rows[derived[i]]
            if end_mark[i] < done and src is not None and rows[i] is None:
                shape, dtype, numel = static[i]
                if src[-1]:  # what cannot describe its argument (edited since the trace)
                    rows[i] = (shape, dtype, *NAN_ROW, None, None, False, src[-1])
                    continue
                stats, nan, inf = (negated_stats(src) if i in plan.negated else
                                   repeated_stats(src, numel / math.prod(src[0])))
                rows[i] = (shape, dtype, *stats, nan, inf, False, "")
        marks, nan = self.marks, math.nan
        times = [marks[e] - marks[e - 1] if 0 < e < done else nan for e in end_mark]
        return [_NOT_RUN if r is None else r for r in rows], times


def _is_mutating(node: fx.Node) -> bool:
    return is_aten_op(node) and bool(op_schema(node.target).is_mutable)


def instrument(joint: TracedGraph, derive: bool = True) -> tuple[fx.GraphModule, ValueObserver]:
    """A copy of the joint graph calling a :class:`ValueObserver` after its nodes.

    Args:
        joint: A traced joint graph.
        derive: Derive the rows of views no in-place op can have changed after
            the step (:class:`Plan`); False observes every node (to keep values).

    Returns:
        The instrumented graph module and its observer.
    """
    src = joint.graph_module.graph
    nodes = list(src.nodes)
    rec = ValueObserver(nodes, derive)
    g = fx.Graph()
    g.set_codegen(copy.copy(graph_codegen(src)))
    env: dict[fx.Node, fx.Node] = {}
    placeholders = [i for i, n in enumerate(nodes) if n.op == "placeholder"]
    for i, n in enumerate(nodes):
        env[n] = g.node_copy(n, lambda a: env[a])
        if n.op == "placeholder" and i == placeholders[-1]:
            for j in placeholders:
                g.call_function(rec.observe, (j, env[nodes[j]]))
        elif n.op in ("placeholder", "output"):
            continue
        elif rec.plan.derived[i] >= 0:
            g.call_function(rec.stamp_end, (i, env[n]))
        else:
            written = [env[a] for a in n.all_input_nodes] if rec.plan.mutates[i] else []
            g.call_function(rec.observe, (i, env[n], *written))
    return fx.GraphModule(joint.graph_module, g), rec
