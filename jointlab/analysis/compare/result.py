"""The result of ``jl.compare``: frozen tables of each candidate against eager.

:class:`Divergence` names the first graph node whose value differs from eager;
:class:`Comparison` holds the loss, gradient, loss_dict and buffer tables,
the verdict, and the notes that say why differences are expected. Both only
hold data; the notebook view is drawn by :mod:`jointlab.viz.comparison`
through :func:`jointlab.display.rich_html`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from jointlab.analysis.compare.capture import EagerCapture
from jointlab.analysis.compare.judge import Tolerance, bit_exact, close, errors
from jointlab.display import rich_html
from jointlab.meta import module_label

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Comparison", "Divergence"]


@dataclass(frozen=True)
class Divergence:
    """The first graph node whose value differs from eager."""

    node: str
    module: str
    source: str
    phase: str
    what: str  # "module output", "output gradient", "parameter gradient", "input gradient",
    # "loss", "kernel output", "output after Inductor's decompositions"
    max_abs_err: float
    max_rel_err: float = 0.0
    candidate: str = "graph"  # which candidate diverges: "graph" or a compiled backend
    kernel: str = ""  # the first diverging kernel call of a compiled candidate, if named
    input: str = ""  # for an "input gradient": the dotted path of that input

    def __repr__(self) -> str:
        """``Divergence(<one line>)``: node, what, module, phase, source and errors."""
        return f"Divergence({self})"

    def __str__(self) -> str:
        """One line naming node, the module the value belongs to, and source."""
        what = (f"the loss, computed in {self.module}" if self.what == "loss"
                else f"gradient of input '{self.input}'" if self.what == "input gradient"
                else f"{self.what} of module '{module_label(self.module)}'")
        where = "" if self.candidate == "graph" else (
            f"{self.candidate} kernel {self.kernel}, at " if self.kernel
            else f"{self.candidate}: ")
        return (f"{where}{self.node} ({what}, {self.phase}, "
                f"{self.source or 'no source'}): max abs err {self.max_abs_err:.3g}, "
                f"max rel err {self.max_rel_err:.3g}")


def _rows(pairs: dict[str, tuple[Any, Any]], tol: Tolerance, candidate: str,
          scale: Callable[[str], torch.Tensor | None] | None = None) -> list[dict]:
    rows = []
    for name, (got, want) in pairs.items():
        if want is None:  # eager has no gradient: graph must emit zeros
            want = torch.zeros_like(got)
        abs_err, rel_err, cos = errors(got, want)
        ok = close(got, want, tol)
        if not ok and scale is not None and not tol.exact:
            ok = close(got, want, tol, scale(name))  # relative to what produced it
        rows.append({"candidate": candidate, "name": name, "shape": tuple(got.shape),
                     "dtype": str(got.dtype).removeprefix("torch."), "max_abs_err": abs_err,
                     "max_rel_err": rel_err, "cosine": cos, "exact": bit_exact(got, want),
                     "ok": ok})
    return rows


@dataclass(frozen=True)
class Comparison:
    """Graph (and compiled) results against eager autograd for one training step.

    Attributes:
        ok: Every loss, gradient, loss_dict value, buffer and probed value is
            within tolerance.
        exact: Every compared value is bitwise equal to eager's.
        verdict: ``"bit-exact"``, ``"within tolerance"`` or ``"MISMATCH"``.
        loss: DataFrame: one row per candidate, the loss beside eager's.
        grads: DataFrame: one row per candidate and parameter with ``max_abs_err``,
            ``max_rel_err``, ``cosine``, ``exact`` and ``ok``.
        loss_dict: DataFrame like ``grads`` for the loss_dict values.
        buffers: DataFrame like ``grads`` for the buffers after the step.
        first_divergence: The first graph node beyond tolerance, or None.
        first_inexact: The first graph node not bitwise equal to eager, or None.
        notes: Why differences from eager are expected here (dtype, mode, device).
        unchecked: Modules whose intermediate values could not be paired with
            eager's (their call counts differ), so they were not checked.
        fp64: When a compiled candidate is not bit-exact: per value, its and eager's
            max abs distance to eager run in float64, and which side is closer
            (None otherwise).
        kernels: Per compiled candidate that does not match (Inductor only): the
            kernel-by-kernel check naming its first diverging kernel
            (:class:`jointlab.analysis.kernel_probe.KernelCheck`); None otherwise.
        input_grads: DataFrame like ``grads``, one row per candidate and input traced
            with ``requires_grad=True`` (``name`` is the input path), against eager's
            gradient of that input; empty when no input requires grad.
    """

    ok: bool
    exact: bool
    verdict: str
    loss: pd.DataFrame
    grads: pd.DataFrame
    loss_dict: pd.DataFrame
    buffers: pd.DataFrame
    first_divergence: Divergence | None
    first_inexact: Divergence | None
    notes: tuple[str, ...]
    unchecked: tuple[str, ...]
    fp64: pd.DataFrame | None = None
    kernels: dict[str, Any] | None = None
    input_grads: pd.DataFrame | None = None

    @classmethod
    def build(cls, results: dict[str, tuple], eager: EagerCapture, first: Divergence | None,
              inexact: Divergence | None, tols: dict[str, Tolerance], notes: list[str],
              unchecked: list[str], scale: Callable[[str, str], Any] | None = None
              ) -> Comparison:
        """Assemble the tables from each candidate's ``(outputs, buffers)``.

        ``scale(table, name)`` gives the magnitudes that produced a loss or
        gradient (:mod:`jointlab.analysis.compare.scale`); a value beyond
        tolerance of its own size but within tolerance of that scale is ok.
        """
        def of(table: str) -> Callable[[str], Any] | None:
            return None if scale is None else (lambda name: scale(table, name))

        loss_rows, grad_rows, ld_rows, buf_rows, in_rows = [], [], [], [], []
        for name, (out, bufs) in results.items():
            loss, grads, ld = out
            tol = tols[name]
            loss_rows += _rows({"loss": (loss, eager.loss)}, tol, name, of("loss"))
            loss_rows[-1].update(value=float(loss), eager=float(eager.loss))
            grad_rows += _rows({k: (g, eager.grads[k]) for k, g in grads.items()}, tol, name,
                               of("grads"))
            in_rows += _rows({k: (g, eager.input_grads.get(k)) for k, g in
                              getattr(out, "input_grads", {}).items()}, tol, name,
                             of("input_grads"))
            ld_rows += _rows({k: (v, eager.loss_dict[k]) for k, v in ld.items()
                              if isinstance(v, torch.Tensor)}, tol, name)
            buf_rows += _rows({k: (v, eager.buffers[k]) for k, v in bufs.items()
                               if k in eager.buffers}, tol, name)
        tables = [_frame(r) for r in (loss_rows, grad_rows, ld_rows, buf_rows, in_rows)]
        ok = all(bool(t["ok"].all()) for t in tables if len(t)) and first is None
        exact = ok and inexact is None and all(bool(t["exact"].all()) for t in tables if len(t))
        verdict = "bit-exact" if exact else "within tolerance" if ok else "MISMATCH"
        return cls(ok, exact, verdict, *tables[:4], first, None if exact else inexact,
                   tuple(notes), tuple(unchecked), input_grads=tables[4])

    def _earlier_inexact(self) -> Divergence | None:
        """The first inexact node when it is not the first divergence itself."""
        d, first = self.first_inexact, self.first_divergence
        return None if d is None or (first is not None and d.node == first.node) else d

    def __repr__(self) -> str:
        """The verdict, the first divergence and the worst gradient, in a few lines."""
        lines = [f"Comparison({self.verdict}"]
        if self.first_divergence is not None:
            lines.append(f"  first divergence: {self.first_divergence}")
        if self._earlier_inexact() is not None:
            lines.append(f"  first inexact node: {self.first_inexact}")
        if len(self.grads) and not self.exact:
            worst = self.grads.loc[self.grads["max_abs_err"].idxmax()]
            lines.append(f"  worst gradient: {worst['name']} (max abs err "
                         f"{worst['max_abs_err']:.3g}, cosine {worst['cosine']:.6f})")
        lines += [f"  note: {n}" for n in self.notes if not self.exact]
        if self.unchecked:
            lines.append(f"  not checked module by module: {', '.join(self.unchecked)}")
        if self.fp64 is not None and len(self.fp64):
            n = int((self.fp64["closer"] == "eager").sum())
            lines.append(f"  vs float64 eager: eager closer on {n} of {len(self.fp64)} values, "
                         "the compiled side on "
                         f"{int((~self.fp64['closer'].isin(['eager', 'tie'])).sum())}")
        lines += _kernel_lines(self.kernels or {})
        return "\n".join(lines) + ")"

    def _repr_html_(self) -> str:
        return rich_html("comparison", self)


def _kernel_lines(kernels: dict[str, Any]) -> list[str]:
    """The repr's lines for each compiled candidate's kernel-by-kernel check."""
    lines = []
    for name, check in kernels.items():
        if check.first is not None:
            lines.append(f"  first diverging kernel ({name}): {check.first}")
        elif check.note:
            lines.append(f"  {name}: {check.note}")
        else:
            lines.append(f"  {name}: all {check.checked} checked kernels match Inductor's "
                         "post-grad graph run eagerly, so the difference arose before "
                         "lowering (a decomposition or graph pass); jl.bisect compares "
                         "regions with the traced graph")
    return lines


def _frame(rows: list[dict]) -> pd.DataFrame:
    import pandas as pd

    cols = ["candidate", "name", "shape", "dtype", "max_abs_err", "max_rel_err", "cosine",
            "exact", "ok"]
    df = pd.DataFrame(rows)
    return df if len(df) else pd.DataFrame(columns=cols)
