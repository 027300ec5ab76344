"""Value statistics, the one implementation: ``jl.record``'s table and the stepper panel.

:func:`describe` gives the statistics of one value as a :class:`ValueStats`;
``jl.record``'s table and the stepper panel (its inspector and the DAG detail
rows) show exactly these, formatted. The definitions, once: statistics are over
every element in float32 (float64 for float64 and integer values); ``std`` is
the population standard deviation (``correction=0``, numpy's default, not
``torch.std``'s Bessel correction), so ``std**2 + mean**2 == norm**2 / numel``;
when a value holds NaN or Inf, mean/std/min/max/norm are over its finite
elements and ``nan``/``inf`` count the others (all NaN when none is finite).

:class:`ValueObserver` is called by an instrumented copy of the joint graph
(:func:`instrument`) after every node. Per node it keeps the value's shape and
dtype, mean, population standard deviation, min, max, L2 norm, NaN and Inf
counts, the node's wall time, and optionally a clone of the value within a
byte budget. Views and other ops that only rearrange their argument reuse the
argument's statistics unless something wrote in place in between. A value whose
infinities are an attention mask's ``-inf`` fill is marked as one
(:func:`_mask_nodes` states the rule). The graph it instruments is a copy; the
user's graph is never edited.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from jointlab.meta import is_aten_op, op_name
from jointlab.torch_compat import graph_codegen, op_schema

if TYPE_CHECKING:
    from jointlab.core import TracedGraph

__all__ = ["NAN_ROW", "SAME_VALUES", "STAT_COLUMNS", "ValueObserver", "ValueStats", "describe",
           "instrument"]

#: Columns of :attr:`Record.table`; none collides with a ``joint.nodes`` column.
STAT_COLUMNS = ("value_shape", "value_dtype", "mean", "std", "min", "max", "norm", "nan", "inf",
                "time_s", "kept", "note", "mask")
#: Ops that build an additive attention mask from a ``-inf`` fill value (a literal
#: ``-inf`` argument, or a ``-inf`` scalar node that ``where`` selects from).
_MASK_FILL = frozenset({"scalar_tensor", "full", "full_like", "new_full", "fill", "fill_",
                        "masked_fill", "masked_fill_", "where", "lift_fresh_copy"})
#: Ops that carry a mask's values over unchanged (rearranged, selected, repeated).
_MASK_CARRY = frozenset({"view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose",
                         "permute", "unsqueeze", "squeeze", "alias", "detach", "clone",
                         "contiguous", "view_as", "flatten", "unflatten", "movedim", "expand",
                         "slice", "select", "cat", "repeat", "_to_copy", "to"})
#: Ops whose output holds no defined values until something writes into it.
_UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                            "new_empty_strided", "empty_permuted"})
#: Below this variance / mean**2 the one-pass variance loses digits; use two passes.
_CANCELLATION = 0.1
NAN_ROW = (math.nan,) * 5
#: Ops whose output holds exactly the values of their first argument, rearranged:
#: its statistics are the argument's, unless something wrote in place in between.
SAME_VALUES = frozenset({"view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose",
                         "permute", "unsqueeze", "squeeze", "alias", "detach", "clone",
                         "contiguous", "view_as", "flatten", "unflatten", "movedim"})


_STRIDED = torch.strided
#: dtype -> its name without ``torch.`` (the common ones; others are spelled on the fly).
_DTYPE_NAMES = {d: str(d).removeprefix("torch.") for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool)}


def _is_dense(x: torch.Tensor) -> bool:
    """True when ``x`` covers its memory exactly once, in some dimension order."""
    expected = 1
    for size, stride in sorted((d for d in zip(x.shape, x.stride()) if d[0] != 1),
                               key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _flat(x: torch.Tensor) -> torch.Tensor:
    """``x``'s elements as one contiguous 1-D tensor (a view when its memory is dense).

    Full reductions do not depend on element order, and a transposed tensor
    reduces several times slower than its contiguous memory.
    """
    if x.is_contiguous():
        return x.view(-1)
    if _is_dense(x):
        return x.as_strided((x.numel(),), (1,), x.storage_offset())
    return x.reshape(-1)


def _describe(x: torch.Tensor) -> tuple[tuple[float, ...], int, int]:
    """``(mean, std, min, max, norm)``, #NaN and #Inf of a strided real tensor.

    Three reductions over the value where it lies (min and max together, sum,
    L2 norm); a constant value needs only the first; a mean-dominated one (where
    ``E[x^2] - mean^2`` would cancel) takes one more pass for an exact variance.
    """
    if not x.is_contiguous():
        x = _flat(x)
    if x.dtype is not torch.float32 and x.dtype is not torch.float64:
        x = x.float() if x.dtype.is_floating_point else x.double()
    lo, hi = torch.aminmax(x)
    lo_f, hi_f = lo.item(), hi.item()
    n = x.numel()
    if not (math.isfinite(lo_f) and math.isfinite(hi_f)):  # aminmax propagates NaN
        return _describe_nonfinite(x)
    if lo_f == hi_f:  # constant: every statistic follows from the one value
        return (lo_f, 0.0, lo_f, hi_f, abs(lo_f) * math.sqrt(n)), 0, 0
    mean, nrm = x.sum().item() / n, torch.linalg.vector_norm(x).item()
    var = nrm * nrm / n - mean * mean
    if var < _CANCELLATION * mean * mean:  # mean-dominated: exact two-pass variance
        std = torch.linalg.vector_norm(x - mean).item() / math.sqrt(n)
    else:
        std = math.sqrt(var)
    return (mean, std, lo_f, hi_f, nrm), 0, 0


def _describe_nonfinite(x: torch.Tensor) -> tuple[tuple[float, ...], int, int]:
    """:func:`_describe` of a value holding NaN or Inf: statistics of its finite elements.

    Arithmetic only (``nan_to_num`` and reductions), no boolean masks: they run
    several times slower than arithmetic on CPU, and a masked copy more so.
    """
    n = x.numel()
    zero = torch.nan_to_num(x, 0.0, 0.0, 0.0)  # the finite elements, the others 0
    # at a finite element both terms are x (difference exactly 0); elsewhere 1 - 0
    nan = int(torch.nan_to_num(x, 1.0, 0.0, 0.0).sub_(zero).sum(dtype=torch.float64))
    inf = int(torch.nan_to_num(x, 0.0, 1.0, 1.0).sub_(zero).sum(dtype=torch.float64))
    k = n - nan - inf
    if k == 0:
        return NAN_ROW, nan, inf
    lo = torch.nan_to_num(x, math.inf, math.inf, math.inf).amin().item()
    hi = torch.nan_to_num(x, -math.inf, -math.inf, -math.inf).amax().item()
    mean, nrm = zero.sum().item() / k, torch.linalg.vector_norm(zero).item()
    # exact two-pass variance: the non-finite elements become the mean, adding 0
    dev = torch.nan_to_num(x, mean, mean, mean).sub_(mean)
    std = torch.linalg.vector_norm(dev).item() / math.sqrt(k)
    return (mean, std, lo, hi, nrm), nan, inf


def _expanded(row: tuple[Any, ...], times: float) -> tuple[tuple[float, ...], Any, Any]:
    """Statistics of a value repeated ``times`` times: same moments, scaled norm and counts."""
    mean, std, lo, hi, nrm = row[2:7]
    return (mean, std, lo, hi, nrm * math.sqrt(times)), row[7] * int(times), row[8] * int(times)


def _why_not(value: torch.Tensor, uninitialized: bool) -> str:
    """Why the tensor ``value`` gets no statistics, or ``""`` when it does."""
    if uninitialized:
        return "uninitialized"
    if value.layout != torch.strided:
        return "sparse"
    if value.is_quantized:
        return "quantized"
    if value.is_complex():
        return "complex"
    if value.numel() == 0:
        return "empty"
    return ""


@dataclass(frozen=True)
class ValueStats:
    """Statistics of one value (see the module docstring for the definitions).

    Attributes:
        shape: The tensor's shape (None for a non-tensor).
        dtype: Its dtype without ``torch.`` (the type name for a non-tensor).
        mean: Mean of the (finite) elements.
        std: Population standard deviation (``correction=0``) of the (finite) elements.
        min: Smallest (finite) element.
        max: Largest (finite) element.
        norm: L2 norm of the (finite) elements.
        nan: Number of NaN elements (None when not described).
        inf: Number of +-Inf elements (None when not described).
        note: Why there are no statistics (``""`` when there are): ``uninitialized``,
            ``sparse``, ``quantized``, ``complex``, ``empty`` or ``not a tensor``.
    """

    shape: tuple[int, ...] | None
    dtype: str
    mean: float
    std: float
    min: float
    max: float
    norm: float
    nan: int | None
    inf: int | None
    note: str


def describe(value: Any, *, uninitialized: bool = False) -> ValueStats:
    """The statistics of ``value``, as ``jl.record``'s table and the stepper panel show them.

    Args:
        value: Any node value; only a tensor gets statistics.
        uninitialized: The value comes from an ``empty*`` op (its memory is garbage).

    Returns:
        A :class:`ValueStats`.
    """
    if not isinstance(value, torch.Tensor):
        return ValueStats(None, type(value).__name__, *NAN_ROW, None, None, "not a tensor")
    note = _why_not(value, uninitialized)
    stats, nan, inf = (NAN_ROW, None, None) if note else _describe(value)
    return ValueStats(tuple(value.shape), str(value.dtype).removeprefix("torch."), *stats, nan,
                      inf, note)


class ValueObserver:
    """The observer the instrumented graph calls after each node."""

    def __init__(self, nodes: list[fx.Node]) -> None:
        self.nodes = nodes
        index = {n: i for i, n in enumerate(nodes)}
        #: Per node: whether it writes into an input (its schema says so).
        self.mutates = [_is_mutating(n) for n in nodes]
        #: Per node: the index of the node whose values it rearranges, or -1.
        self.same_as = [index.get(n.args[0], -1) if op_name(n) in SAME_VALUES | {"expand"}
                        and n.args and isinstance(n.args[0], fx.Node) else -1 for n in nodes]
        self.uninitialized = [op_name(n) in _UNINITIALIZED for n in nodes]
        #: Per node: whether its -inf may be an attention mask (:func:`_mask_nodes`).
        self.maskable = _mask_nodes(nodes)
        #: Per node: the mask it adds to scores, or -1 (:func:`_mask_sums`).
        self.mask_sum = _mask_sums(nodes, self.maskable)
        #: Per node: whether another node may reuse its statistics (only these need a stamp).
        self.is_source = [False] * len(nodes)
        for src in self.same_as:
            if src >= 0:
                self.is_source[src] = True
        #: The record table's index: the node names in graph order. pandas is imported here,
        #: not with the module: the stepper panel's first view needs describe() only.
        import pandas as pd

        self.index = pd.Index([n.name for n in nodes], name="node")
        self.reset(0)

    def reset(self, keep_bytes: int) -> None:
        n = len(self.nodes)
        #: Per node: its row of statistics (None until it runs).
        self.rows: list[tuple[Any, ...] | None] = [None] * n
        #: Per node: its wall time in seconds (NaN until it runs).
        self.times: list[float] = [math.nan] * n
        self.values: dict[str, torch.Tensor] = {}
        self.budget = keep_bytes
        #: Per node: its value's infinities are all -inf and it is an attention mask.
        self.mask = [False] * len(self.nodes)
        #: Per storage (its data pointer): how many in-place ops wrote into it so far.
        self.writes: dict[int, int] = {}
        #: Per node: its value's storage and that storage's write count when it ran.
        self.stamp: dict[int, tuple[int, int]] = {}
        self.numel: dict[int, int] = {}
        self.last_done = -1
        self.clock = time.perf_counter()

    def _unchanged(self, src: int) -> bool:
        """Whether node ``src``'s storage saw no in-place write since ``src`` ran."""
        stamp = self.stamp.get(src)
        return stamp is not None and self.writes.get(stamp[0], 0) == stamp[1] and not (
            self.rows[src][-1])  # type: ignore[index]

    def _tensor_row(self, i: int, value: torch.Tensor) -> tuple[Any, ...]:
        numel = value.numel()
        if (numel and value.layout is _STRIDED and not value.is_complex()
                and not value.is_quantized and not self.uninitialized[i]):
            note = ""
            src = self.same_as[i]
            if src >= 0 and self._unchanged(src):
                # same values (or repeated, for expand) as a node whose value is unchanged since
                stats, nan, inf = _expanded(self.rows[src], numel / self.numel[src])
            else:
                stats, nan, inf = _describe(value)
        else:
            note = _why_not(value, self.uninitialized[i])
            stats, nan, inf = NAN_ROW, None, None
        kept = False
        if self.budget:
            kept = 0 < value.nbytes <= self.budget
            if kept:
                self.values[self.nodes[i].name] = value.detach().clone()
                self.budget -= value.nbytes
        if self.is_source[i]:
            self.numel[i] = numel
            ptr = value.untyped_storage().data_ptr()
            self.stamp[i] = (ptr, self.writes.get(ptr, 0))
        dtype = _DTYPE_NAMES.get(value.dtype) or str(value.dtype).removeprefix("torch.")
        return (tuple(value.shape), dtype, *stats, nan, inf, kept, note)

    def _is_mask(self, i: int, value: torch.Tensor, row: tuple[Any, ...]) -> bool:
        """Whether node ``i``'s infinities (no NaN) are an attention mask's -inf."""
        neg = int((value == -math.inf).sum())
        if neg != row[8]:  # a +inf is no mask
            return False
        j = self.mask_sum[i]
        if j < 0:
            return True
        # scores + mask: exactly the mask's -inf, broadcast to the sum's shape
        src = self.rows[j]
        return bool(src and src[8] is not None and src[0] is not None
                    and src[8] * value.numel() == neg * math.prod(src[0]) and self.mask[j])

    def observe(self, i: int, value: Any, *written: Any) -> None:
        """Record node ``i``'s value; its time runs from the previous node's end.

        ``written`` are the inputs of an op whose schema mutates: their storages
        count as written (all of them, to be safe).
        """
        for t in written:
            if isinstance(t, torch.Tensor):
                ptr = t.untyped_storage().data_ptr()
                self.writes[ptr] = self.writes.get(ptr, 0) + 1
        if isinstance(value, torch.Tensor):
            if value.is_cuda:
                torch.cuda.synchronize(value.device)
            self.times[i] = time.perf_counter() - self.clock
            row = self.rows[i] = self._tensor_row(i, value)
            if row[8] and row[7] == 0 and (self.maskable[i] or self.mask_sum[i] >= 0):
                self.mask[i] = self._is_mask(i, value, row)
        else:
            self.times[i] = time.perf_counter() - self.clock
            self.rows[i] = (None, type(value).__name__, *NAN_ROW, None, None, False,
                            "not a tensor")
        self.last_done = i
        self.clock = time.perf_counter()


def _mask_nodes(nodes: list[fx.Node]) -> list[bool]:
    """Per node: whether its ``-inf`` values, if any, are an attention mask's.

    The rule: a node is a mask when it fills with ``-inf`` (an op of
    :data:`_MASK_FILL` with a literal ``-inf`` argument, or a ``where``/fill
    whose value argument is such a node), or carries a mask's values over
    unchanged (:data:`_MASK_CARRY` of a mask node). At run time its value counts
    as a mask only when every non-finite element is exactly ``-inf`` (a NaN or a
    ``+inf`` is reported as a numerical problem). Arithmetic on a mask (scores +
    mask) is not a mask: its ``-inf`` are counted. A mask filled with the
    dtype's min (``torch.finfo(dtype).min``, what HF uses in eager attention) is
    finite and never counted.
    """
    out: dict[fx.Node, bool] = {}
    for n in nodes:
        name = op_name(n) if n.op == "call_function" else ""
        flat: list[Any] = []
        fx.node.map_aggregate((n.args, n.kwargs), flat.append)
        from_mask = any(isinstance(a, fx.Node) and out.get(a, False) for a in flat)
        if name in _MASK_FILL:
            out[n] = from_mask or any(isinstance(a, float) and a == -math.inf for a in flat)
        else:
            out[n] = name in _MASK_CARRY and from_mask
    return [out[n] for n in nodes]


def _mask_sums(nodes: list[fx.Node], maskable: list[bool]) -> list[int]:
    """Per node: for ``scores + mask`` (``add`` of exactly one mask node), the mask's index.

    Such a sum is a mask when its ``-inf`` are exactly the mask's, broadcast
    (:meth:`ValueObserver.observe` compares the counts); -1 for other nodes.
    """
    index = {n: i for i, n in enumerate(nodes)}
    out = [-1] * len(nodes)
    for i, n in enumerate(nodes):
        if n.op == "call_function" and op_name(n) in ("add", "add_") and len(n.args) >= 2:
            masks = [index[a] for a in n.args[:2] if isinstance(a, fx.Node) and maskable[index[a]]]
            if len(masks) == 1:
                out[i] = masks[0]
    return out


def _is_mutating(node: fx.Node) -> bool:
    return is_aten_op(node) and bool(op_schema(node.target).is_mutable)


def instrument(joint: TracedGraph) -> tuple[fx.GraphModule, ValueObserver]:
    """A copy of the joint graph calling a recorder after every node (placeholders last)."""
    src = joint.graph_module.graph
    nodes = list(src.nodes)
    rec = ValueObserver(nodes)
    g = fx.Graph()
    g.set_codegen(copy.copy(graph_codegen(src)))
    env: dict[fx.Node, fx.Node] = {}
    placeholders = [i for i, n in enumerate(nodes) if n.op == "placeholder"]
    for i, n in enumerate(nodes):
        env[n] = g.node_copy(n, lambda a: env[a])
        if n.op == "placeholder" and i == placeholders[-1]:
            for j in placeholders:
                g.call_function(rec.observe, (j, env[nodes[j]]))
        elif n.op not in ("placeholder", "output"):
            written = [env[a] for a in n.all_input_nodes] if rec.mutates[i] else []
            g.call_function(rec.observe, (i, env[n], *written))
    return fx.GraphModule(joint.graph_module, g), rec
