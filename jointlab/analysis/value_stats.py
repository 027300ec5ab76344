"""Value statistics, the one implementation: ``jl.record``'s table and the stepper panel.

:func:`describe` gives the statistics of one value as a :class:`ValueStats`;
``jl.record``'s table and the stepper panel (its inspector and the DAG detail
rows) show exactly these, formatted. The definitions, once: statistics are over
every element in float32 (float64 for float64 and integer values); ``std`` is
the population standard deviation (``correction=0``, numpy's default, not
``torch.std``'s Bessel correction), so ``std**2 + mean**2 == norm**2 / numel``;
when a value holds NaN or Inf, mean/std/min/max/norm are over its finite
elements and ``nan``/``inf`` count the others (all NaN when none is finite).

``jl.record`` (its observer is :mod:`jointlab.analysis.observer`) and the
stepper's inspector call :func:`tensor_stats` on each value; a value that only
rearranges (:data:`SAME_VALUES`) or repeats another's takes that one's
statistics through :func:`repeated_stats`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["NAN_ROW", "SAME_VALUES", "STAT_COLUMNS", "ValueStats", "describe", "dtype_name",
           "negated_stats", "repeated_stats", "tensor_stats", "why_not"]

#: Columns of :attr:`Record.table`; none collides with a ``joint.nodes`` column.
STAT_COLUMNS = ("value_shape", "value_dtype", "mean", "std", "min", "max", "norm", "nan", "inf",
                "time_s", "kept", "note", "mask")
#: A non-contiguous value of more elements is reduced as its flat memory (see :func:`_flat`);
#: a smaller one in place, where finding its layout would cost more than it saves.
_FLATTEN_ABOVE = 2048
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


def dtype_name(dtype: torch.dtype) -> str:
    """``dtype``'s name as the record table shows it: ``float32``, not ``torch.float32``."""
    return _DTYPE_NAMES.get(dtype) or str(dtype).removeprefix("torch.")


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


def tensor_stats(x: torch.Tensor) -> tuple[tuple[float, ...], int, int]:
    """``(mean, std, min, max, norm)``, #NaN and #Inf of a strided real tensor.

    Three reductions over the value where it lies (min and max together, sum,
    L2 norm); a constant value needs only the first; a mean-dominated one (where
    ``E[x^2] - mean^2`` would cancel) takes one more pass for an exact variance.

    Args:
        x: A strided, real, non-empty tensor.

    Returns:
        ``((mean, std, min, max, norm), nan, inf)``.
    """
    if not x.is_contiguous() and x.numel() > _FLATTEN_ABOVE:
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
    """:func:`tensor_stats` of a value holding NaN or Inf: statistics of its finite elements.

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


def repeated_stats(row: tuple[Any, ...], times: float) -> tuple[tuple[float, ...], Any, Any]:
    """Statistics of a value repeated ``times`` times: same moments, scaled norm and counts.

    Args:
        row: The repeated value's record row (statistics at positions 2-6, NaN
            and Inf counts at 7 and 8).
        times: How many times each element is repeated (1 for a rearrangement).

    Returns:
        ``((mean, std, min, max, norm), nan, inf)`` of the repeated value.
    """
    mean, std, lo, hi, nrm = row[2:7]
    return (mean, std, lo, hi, nrm * math.sqrt(times)), row[7] * int(times), row[8] * int(times)


def negated_stats(row: tuple[Any, ...]) -> tuple[tuple[float, ...], Any, Any]:
    """Statistics of a floating value negated, from its record row, adding no rounding.

    Negation rounds nothing and rounding is symmetric, so a sum of the negated
    elements, taken in the same order, is the negated sum: the mean and the
    extremes change sign (and swap), the spread and the norm do not. (Reducing
    the negated value where it lies may add in another order: the last bits
    of its mean and norm can differ.)

    Args:
        row: The value's record row (statistics at positions 2-6, NaN and Inf
            counts at 7 and 8).

    Returns:
        ``((mean, std, min, max, norm), nan, inf)`` of the negated value.
    """
    mean, std, lo, hi, nrm = row[2:7]
    return (-mean, std, -hi, -lo, nrm), row[7], row[8]


def why_not(value: torch.Tensor, uninitialized: bool) -> str:
    """Why the tensor ``value`` gets no statistics, or ``""`` when it does.

    Args:
        value: A tensor.
        uninitialized: Its op leaves memory undefined (``empty*``).

    Returns:
        ``uninitialized``, ``sparse``, ``quantized``, ``complex``, ``empty`` or ``""``.
    """
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
    note = why_not(value, uninitialized)
    stats, nan, inf = (NAN_ROW, None, None) if note else tensor_stats(value)
    return ValueStats(tuple(value.shape), dtype_name(value.dtype), *stats, nan,
                      inf, note)
