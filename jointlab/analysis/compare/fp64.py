"""Float64 eager as the referee when a compiled candidate is not bitwise equal to eager.

A compiled loss or gradient can differ from float32 eager only because eager
itself rounds; :func:`fp64_table` measures both sides' distance to eager run
in float64, and :func:`accept_by_fp64` accepts (and names in the notes) the
values that are no farther from it than eager is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from jointlab.analysis.compare.capture import EagerCapture, capture_eager, to_device
from jointlab.analysis.compare.judge import Tolerance, errors
from jointlab.analysis.compare.result import Comparison
from jointlab.runtime.kept import hooked_copy

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["accept_by_fp64", "candidate_ok", "compiled_exact", "fp64_reference", "fp64_table"]


def accept_by_fp64(comp: Comparison, eager: EagerCapture, tol: Tolerance,
                   skip: Collection[tuple[str, str]] = ()) -> Comparison:
    """Accept compiled values that are off eager but no farther from float64 than eager is.

    A compiled loss or gradient beyond tolerance of eager is accepted when its max abs
    distance to the float64 reference is at most eager's own distance plus eager's
    absolute tolerance: the difference is then eager's rounding, not a compiler bug
    (a gradient that is zero in exact arithmetic, such as an attention key bias, is
    fp32 rounding noise on both sides). Each accepted value is named in the notes.

    Args:
        comp: The comparison with its ``fp64`` table.
        eager: The float32 eager capture.
        tol: The compiled candidates' tolerance.
        skip: ``(table, name)`` of values float64 may not referee (downstream of a
            random op: :mod:`jointlab.analysis.compare.random_ops`).

    Returns:
        ``comp``, with those rows ok and the verdict recomputed (never ``bit-exact``).
    """
    fp64 = comp.fp64.set_index(["candidate", "name"])
    accepted = []
    tables = {}
    for attr, values in (("loss", {"loss": eager.loss}), ("grads", eager.grads)):
        table = getattr(comp, attr).copy()
        for i, row in table[~table["ok"].astype(bool)].iterrows():
            key, want = (row["candidate"], row["name"]), values.get(row["name"])
            if (key not in fp64.index or not isinstance(want, torch.Tensor)
                    or (attr, row["name"]) in skip):
                continue
            c64, e64 = fp64.loc[key, "candidate_vs_fp64"], fp64.loc[key, "eager_vs_fp64"]
            if c64 <= e64 + tol.bounds(want)[1]:
                table.loc[i, "ok"] = True
                accepted.append(f"{row['name']} ({row['candidate']} {c64:.3g} from float64, "
                                f"eager {e64:.3g})")
        tables[attr] = table
    if not accepted:
        return comp
    ok = comp.first_divergence is None and all(
        bool(t["ok"].all()) for t in (tables["loss"], tables["grads"], comp.loss_dict,
                                      comp.buffers) if len(t))
    note = ("beyond tolerance of eager but no farther from float64 eager than eager itself, "
            "so accepted (eager's own rounding): " + "; ".join(accepted))
    return dataclasses.replace(comp, **tables, ok=ok, exact=False,
                               verdict="within tolerance" if ok else "MISMATCH",
                               notes=(*comp.notes, note))



def candidate_ok(comp: Comparison, name: str) -> bool:
    tables = (comp.loss, comp.grads, comp.loss_dict, comp.buffers, comp.input_grads)
    rows = [t[t["candidate"] == name] for t in tables if t is not None and len(t)]
    return all(bool(r["ok"].all()) for r in rows)



def compiled_exact(comp: Comparison, names: list[str]) -> bool:
    rows = [t[t["candidate"].isin(names)] for t in (comp.loss, comp.grads) if len(t)]
    return all(bool(r["exact"].all()) for r in rows)



def _double(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    if isinstance(value, dict):
        return {k: _double(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_double(v) for v in value)
    return value


def fp64_reference(model: nn.Module, train_fn: Any, inputs: dict[str, Any], names: list[str],
                   seed: int, device: torch.device) -> EagerCapture:
    """Eager autograd in float64 (model and floating inputs cast), same seed: the reference.

    The cast needs a copy of the model: it carries the parameters' hooks, not code
    that refers to the user's own objects (:func:`jointlab.runtime.kept.hooked_copy`).

    Returns:
        The float64 eager capture.
    """
    m = hooked_copy(model, device, torch.float64)  # the parameters' hooks carried over
    return capture_eager(m, train_fn, _double(to_device(inputs, device)), names, seed=seed)


def fp64_table(results: dict[str, tuple], eager: EagerCapture, ref: EagerCapture,
               compiled: list[str]) -> pd.DataFrame:
    """Per compiled candidate and value: its and eager's max abs distance to float64.

    ``closer`` says which side is nearer the float64 reference, so a mismatch
    caused by an ill-conditioned eager computation shows as ``closer == name``.
    """
    import pandas as pd

    rows = []
    for name in compiled:
        (loss, grads, _ld), _bufs = results[name]
        pairs = {"loss": (loss, eager.loss, ref.loss)}
        pairs.update({k: (g, eager.grads[k], ref.grads[k]) for k, g in grads.items()
                      if eager.grads.get(k) is not None and ref.grads.get(k) is not None})
        for key, (got, want, exact64) in pairs.items():
            c_err = _dist(got, exact64)
            e_err = _dist(want, exact64)
            rows.append({"candidate": name, "name": key, "candidate_vs_fp64": c_err,
                         "eager_vs_fp64": e_err,
                         "closer": name if c_err < e_err else "eager" if e_err < c_err
                         else "tie"})
    return pd.DataFrame(rows, columns=["candidate", "name", "candidate_vs_fp64",
                                       "eager_vs_fp64", "closer"])


def _dist(a: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs difference of ``a`` from the float64 ``ref``, computed in float64."""
    return errors(a, ref.reshape(a.shape) if a.numel() == ref.numel() else ref)[0]

