"""How a graph value is judged against eager's: dtype tolerances, bitwise checks, errors.

:class:`Tolerance` says how two values are compared (explicit ``rtol``/``atol``,
exact, or defaults that follow the lowest-precision dtype the graph computes
in, with the absolute part scaled by each tensor's own magnitude).
:func:`expects_exact` says when a graph and eager must agree bitwise, and
:meth:`Tolerance.reasons` says in words why differences are expected when
they need not. :func:`errors`, :func:`bit_exact` and :func:`close` are the
numeric comparisons every reader of "does it match eager" shares (compare,
bisect, the stepper's boundary check, the kernel probe, graph diffs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from jointlab.meta import op_name

if TYPE_CHECKING:
    from jointlab.core import TracedGraph

__all__ = ["Tolerance", "bit_exact", "close", "compute_dtype", "default_tolerances", "errors",
           "expects_exact", "order_dependent_ops"]

_TOLERANCES = {  # dtype -> (rtol, atol as a fraction of the tensor's largest |value|)
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}
_PRECISION = [torch.float64, torch.float32, torch.float16, torch.bfloat16]  # high to low


def default_tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """Return ``(rtol, scaled atol)`` for values of ``dtype`` (0, 0 for exact dtypes).

    The absolute tolerance is a fraction of the compared tensor's largest
    magnitude, so a tensor of gradients around 1e-3 is judged at its own scale.
    """
    return _TOLERANCES.get(dtype, (0.0, 0.0))


def _lower(a: torch.dtype | None, b: torch.dtype | None) -> torch.dtype | None:
    ranked = [d for d in (a, b) if d in _PRECISION]
    return max(ranked, key=_PRECISION.index) if ranked else (a or b)


def compute_dtype(joint: TracedGraph) -> torch.dtype | None:
    """The lowest-precision floating dtype any compute node of the graph produces."""
    low = None
    for n in joint.graph.nodes:
        val = n.meta.get("val")
        if n.op == "call_function" and isinstance(val, torch.Tensor):
            low = _lower(low, val.dtype) if val.dtype in _PRECISION else low
    return low


# Ops whose floating-point accumulation order varies from run to run (parallel
# or atomic adds into shared slots), so eager itself is not bitwise
# reproducible; from torch.use_deterministic_algorithms' documentation.
_INDEX_PUT = {"index_put", "index_put_", "_unsafe_index_put", "_index_put_impl_", "put", "put_"}
_ORDER_DEPENDENT = {
    "cpu": frozenset(_INDEX_PUT),
    "cuda": frozenset(_INDEX_PUT | {
        "index_add", "index_add_", "scatter_add", "scatter_add_", "scatter_reduce",
        "scatter_reduce_", "index_reduce", "index_reduce_", "embedding_dense_backward",
        "_embedding_bag_backward", "_embedding_bag_dense_backward", "histc", "bincount",
        "index_select_backward", "cumsum", "kthvalue", "median", "nll_loss2d_forward",
        "upsample_bilinear2d_backward", "_adaptive_avg_pool2d_backward",
        "max_pool3d_with_indices_backward", "convolution_backward", "avg_pool3d_backward"}),
}


def order_dependent_ops(joint: TracedGraph, devices: set[str]) -> list[str]:
    """Ops of the graph whose results may differ bitwise between two eager runs."""
    risky = frozenset().union(*(_ORDER_DEPENDENT.get(d, _ORDER_DEPENDENT["cuda"])
                                for d in devices))
    return sorted({op_name(n) for n in joint.graph.nodes
                   if n.op == "call_function" and op_name(n) in risky})


def expects_exact(joint: TracedGraph, devices: set[str]) -> bool:
    """True when graph and eager run the same kernels, so they must agree bitwise.

    That holds for a make_fx graph (it records the ATen ops eager dispatches)
    on one device, without order-dependent ops, whatever the dtype: under
    bfloat16 autocast the graph records the casts and the low-precision
    kernels eager runs, so a difference there is no rounding of its own.
    """
    return (joint.mode == "make_fx" and len(devices) == 1
            and not order_dependent_ops(joint, devices))


@dataclass(frozen=True)
class Tolerance:
    """How two values are judged: explicit ``rtol``/``atol``, exact, or dtype defaults."""

    rtol: float | None = None
    atol: float | None = None
    exact: bool = False
    floor: torch.dtype | None = None  # the graph's lowest compute precision

    def bounds(self, want: torch.Tensor) -> tuple[float, float]:
        """``(rtol, absolute atol)`` for comparing against ``want``."""
        if self.exact:
            return 0.0, 0.0
        r, scaled = default_tolerances(_lower(want.dtype, self.floor) or want.dtype)
        if self.atol is not None:
            atol = self.atol
        else:
            big = want.detach().abs().nan_to_num(0.0, 0.0, 0.0).max() if want.numel() else 0
            atol = scaled * float(big)
        return (r if self.rtol is None else self.rtol), atol

    def reasons(self, joint: TracedGraph, devices: set[str]) -> list[str]:
        """Why differences from eager may (or may not) be expected under these settings."""
        if self.exact and not expects_exact(joint, devices):
            return ["exact=True: every value must be bitwise equal"]
        if self.exact:
            return ["graph and eager run the same ATen kernels on the same device, so every "
                    "value must be bitwise equal; any difference is reported (pass "
                    "exact=False to judge by dtype tolerances instead)"]
        out = []
        if ops := order_dependent_ops(joint, devices):
            out.append(f"{', '.join(ops)} accumulate in an order that varies from run to "
                       "run, so eager itself is not bitwise reproducible")
        if self.floor in (torch.float16, torch.bfloat16):
            out.append(f"the graph computes in {str(self.floor).removeprefix('torch.')} "
                       "(autocast or low-precision model): eager and the graph may round "
                       "differently, so tolerances follow that dtype")
        if joint.mode == "aot":
            out.append("AOT mode functionalizes and decomposes some ops, so a few kernels "
                       "differ from eager's and sums may be ordered differently")
        if len(devices) > 1:
            out.append(f"the two sides ran on different devices ({', '.join(sorted(devices))})")
        return out



# -- numeric comparison ----------------------------------------------------------
def errors(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    """Return ``(max abs err, max rel err, cosine similarity)`` of ``a`` against ``b``."""
    if a.shape != b.shape:
        return float("inf"), float("inf"), float("nan")
    x, y = _wide(a).flatten().cpu(), _wide(b).flatten().cpu()
    if x.numel() == 0:
        return 0.0, 0.0, 1.0
    diff = (x - y).abs()  # the modulus for complex values: both parts count
    abs_err = float(diff.max())
    rel_err = float((diff / y.abs().clamp_min(1e-12)).max())
    xr, yr = (torch.view_as_real(v).flatten() if v.is_complex() else v for v in (x, y))
    denom = float(xr.norm() * yr.norm())
    cos = float(xr @ yr) / denom if denom > 0 else (1.0 if abs_err == 0 else 0.0)
    return abs_err, rel_err, cos


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float64, or complex128 when complex (``.double()`` drops the imaginary part)."""
    return t.detach().to(torch.complex128 if t.is_complex() else torch.float64)


def bit_exact(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` are bitwise the same values (NaN where eager has NaN)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.to(b.device), b) or
                ((a.is_floating_point() or a.is_complex())
                 and torch.isclose(a.to(b.device), b, 0.0, 0.0, equal_nan=True).all()))


def close(a: Any, b: Any, tol: Tolerance, scale: torch.Tensor | None = None) -> bool:
    """True when ``a`` matches eager value ``b`` under ``tol``.

    Args:
        a: The value judged.
        b: The reference value.
        tol: How values are judged.
        scale: The magnitudes that produced ``b``, elementwise
            (:func:`jointlab.analysis.compare.scale.produced_scale`): rounding
            is relative to them, so ``rtol`` also applies to ``scale``, and a
            sum whose terms cancel (a gradient that is zero in exact arithmetic)
            is not judged by the size of its rounding noise. Never loosens an
            exact tolerance.
    """
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point() and not a.is_complex():
        return bool(torch.equal(a.to(b.device), b))
    rtol, atol = tol.bounds(b)
    a = a.to(b.device)
    if torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True).all():
        return True
    if scale is None or rtol == 0 or scale.numel() != b.numel():
        return False
    x, y, s = _wide(a), _wide(b), scale.to(b.device).double().reshape(b.shape)
    finite = torch.isfinite(x) & torch.isfinite(y)
    if not bool((finite | (x == y) | (x.isnan() & y.isnan())).all()):
        return False  # an infinity or NaN on one side only
    allowed = atol + rtol * torch.maximum(y.abs(), s.nan_to_num(0.0, 0.0, 0.0))
    return bool(((x - y).abs() <= allowed)[finite].all())
