"""The plan check: every rank's gathered gradients against one device's eager step.

``jl.run_all_ranks(..., reference=model)`` compares each rank with eager run as
that rank (``matches_eager``), which a bug in the parallel plan passes: eager
shares it. This reader answers the other question, *is the plan right?*: the
loss of every rank and each parameter's gradient gathered to its full value
(a DTensor's ``full_tensor()``: shards joined, partial sums reduced, as the
optimizer would see it; a plain parameter's gradient on every rank, since each
rank's copy takes its own step) are compared with one eager step of the
unsharded reference model on one device, on the same inputs.

A sharded step sums in another order than one device, so it is not bitwise
equal. A value within the float32 tolerance of :mod:`jointlab.analysis.compare.judge`
passes; one beyond it is referred to the reference run again in float64: it
passes when its distance to that exact answer is within :data:`ROUNDING_FACTOR`
times the float32 reference's own distance plus the tolerance (reduction-order
rounding), and differs otherwise. Where float64 cannot run, or the step draws
random numbers or reads the rank itself, the answer is "not known", never a
mismatch. The first differing parameter is the first whose gradient the
backward computes (graph order): where the error enters, since every gradient
computed after it from its wrong input gradient differs too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from torch import nn

from jointlab.analysis.compare.capture import EagerCapture, capture_eager
from jointlab.analysis.compare.fp64 import fp64_reference
from jointlab.analysis.compare.judge import Tolerance, close
from jointlab.display import rich_html
from jointlab.errors import StateMismatchError
from jointlab.meta import graph_draws_random, module_label
from jointlab.runtime.dtensor import is_dtensor
from jointlab.runtime.kept import hooked_copy

if TYPE_CHECKING:
    from jointlab.core import TracedGraph

__all__ = ["GradientDifference", "PlanCheck", "ROUNDING_FACTOR", "check_plan"]

#: A sharded value passes when its max abs distance to the float64 reference is at most
#: this many times float32 eager's own distance, plus the float32 tolerance.
ROUNDING_FACTOR = 4.0
_PARAMETRIZED = re.compile(r"\.parametrizations\.([^.]+)\.original\d*$")
GRAD_COLUMNS = ["param", "module", "placement", "rel_err", "max_abs_err", "ranks", "ok", "note"]
LOSS_COLUMNS = ["rank", "loss", "reference", "rel_err", "ok", "note"]


@dataclass(frozen=True)
class GradientDifference:
    """The first parameter whose gathered gradient differs from one device's.

    Attributes:
        param: The parameter's FQN in the unsharded model.
        module: The module that owns it.
        rel_err: ``||sharded - reference|| / ||reference||`` (float64 norms), worst rank.
        max_abs_err: The largest elementwise difference, worst rank.
        ranks: The ranks whose value differs (every rank for a gathered DTensor).
    """

    param: str
    module: str
    rel_err: float
    max_abs_err: float
    ranks: tuple[int, ...]

    def __str__(self) -> str:
        on = f"ranks {', '.join(map(str, self.ranks))}"
        return (f"{self.param} (module {module_label(self.module)!r}): relative error "
                f"{self.rel_err:.3g}, max abs {self.max_abs_err:.3g}, on {on}")


@dataclass(frozen=True)
class PlanCheck:
    """Every rank's loss and gathered gradients against one eager step on one device.

    Attributes:
        ok: True when every value matches one device to rounding, False when one
            differs, None when it is not known (see ``notes``).
        verdict: ``"matches one device"``, ``"DIFFERS from one device"`` or
            ``"not known"``.
        first: The first differing parameter in backward order, or None.
        loss: One row per rank: its loss, the reference's, rel_err, ok, note.
        grads: One row per parameter in module order: param, module, placement,
            rel_err, max_abs_err, ranks (that differ), ok (True/False/None), note.
        notes: How values were judged, and what is not known and why.
    """

    ok: bool | None
    verdict: str
    first: GradientDifference | None
    loss: pd.DataFrame
    grads: pd.DataFrame
    notes: tuple[str, ...] = ()

    def __repr__(self) -> str:
        """The verdict, the first differing parameter and the loss, in a few lines."""
        lines = [f"PlanCheck({self.verdict}: {len(self.grads)} gathered gradients and "
                 f"{len(self.loss)} ranks' losses against one device"]
        if self.first is not None:
            lines.append(f"  first differing gradient: {self.first}")
            bad = self.grads[self.grads["ok"].eq(False)]["param"].tolist()
            if len(bad) > 1:
                lines.append(f"  {len(bad)} gradients differ: {', '.join(bad[:6])}"
                             f"{', ...' if len(bad) > 6 else ''}")
        worst = self.loss.loc[self.loss["rel_err"].idxmax()] if len(self.loss) else None
        if worst is not None:
            lines.append(f"  loss: rank {worst['rank']} {worst['loss']:.6g}, one device "
                         f"{worst['reference']:.6g} (relative error {worst['rel_err']:.3g})")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines) + ")"

    def _repr_html_(self) -> str:
        return rich_html("plan", self)


def unsharded_name(fqn: str) -> str:
    """A sharded model's parameter FQN as the unsharded model spells it.

    A parametrised parameter (``fc1.parametrizations.weight.original``, SimpleFSDP
    style) is the unsharded model's ``fc1.weight``.
    """
    return _PARAMETRIZED.sub(r".\1", fqn)


def _reference_names(model: nn.Module, reference: nn.Module) -> dict[str, str]:
    """Each sharded parameter's FQN to the reference's, refused unless they correspond."""
    ref = [n for n, p in reference.named_parameters() if p.requires_grad]
    names = {n: unsharded_name(n) for n, p in model.named_parameters() if p.requires_grad}
    missing, extra = set(names.values()) - set(ref), set(ref) - set(names.values())
    if missing or extra:
        raise StateMismatchError(
            "reference= must be the unsharded model of the sharded one: "
            + (f"it has no parameter {sorted(missing)[:4]}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"the sharded model has no {sorted(extra)[:4]}" if extra else "")
            + ". Pass the model as it was before parallelize_module (a copy made then).")
    if any(is_dtensor(p) for p in reference.parameters()):
        raise StateMismatchError(
            "reference= holds DTensor parameters; the plan check needs the unsharded model on "
            "one device (the model as it was before parallelize_module).")
    return names


def _reference_steps(reference: nn.Module, train_fn: Callable[..., Any],
                     inputs: dict[str, Any], names: list[str]
                     ) -> tuple[EagerCapture, EagerCapture | None, str]:
    """One eager step of copies of ``reference``: as it is, and in float64 (None if it fails)."""
    device = next(reference.parameters()).device
    eager = capture_eager(hooked_copy(reference, device), train_fn, inputs, names, seed=0)
    try:
        wide = fp64_reference(reference, train_fn, inputs, names, 0, device)
    except Exception as exc:  # noqa: BLE001 - any failure only leaves rounding unjudged
        return eager, None, f"{type(exc).__name__}: {str(exc)[:160]}"
    return eager, wide, ""


def _judge(got: torch.Tensor, want: torch.Tensor, wide: torch.Tensor | None,
           tol: Tolerance) -> tuple[bool | None, float, float]:
    """``(ok or None if not known, relative error, max abs error)`` of one value."""
    if tuple(got.shape) != tuple(want.shape):
        return False, float("inf"), float("inf")
    x, y = got.detach().double().cpu(), want.detach().double().cpu()
    diff = x - y
    norm = float(y.norm())
    rel = float(diff.norm()) / norm if norm > 0 else (0.0 if not diff.any() else float("inf"))
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    if close(got.detach().to(want.dtype), want.detach(), tol):
        return True, rel, max_abs
    if wide is None:
        return None, rel, max_abs
    exact = wide.detach().cpu()
    own = float((y - exact).abs().max()) if y.numel() else 0.0
    theirs = float((x - exact).abs().max()) if x.numel() else 0.0
    return theirs <= ROUNDING_FACTOR * own + tol.bounds(want)[1], rel, max_abs


def _overall(oks: Iterable[bool | None]) -> bool | None:
    """False if any value differs, else None if any is not known, else True."""
    oks = list(oks)
    return False if False in oks else (None if None in oks else True)


def _judge_ranks(values: dict[int, torch.Tensor], want: torch.Tensor,
                 wide: torch.Tensor | None, tol: Tolerance
                 ) -> tuple[bool | None, float, float, tuple[int, ...]]:
    """One value on every rank: ``(ok, worst rel err, worst max abs, the ranks that differ)``."""
    seen: list[tuple[torch.Tensor, tuple[bool | None, float, float]]] = []
    per_rank = {}
    for rank, got in values.items():
        same = next((v for t, v in seen if t.shape == got.shape and torch.equal(t, got)), None)
        per_rank[rank] = same if same is not None else _judge(got, want, wide, tol)
        if same is None:
            seen.append((got, per_rank[rank]))
    ok = _overall(v[0] for v in per_rank.values())
    bad = tuple(r for r, v in per_rank.items() if v[0] is False)
    return (ok, max(v[1] for v in per_rank.values()), max(v[2] for v in per_rank.values()),
            bad)


def _placement(param: torch.Tensor) -> str:
    if is_dtensor(param):
        return ", ".join(str(p) for p in param.placements)
    return "plain (a copy per rank)"


def _backward_order(graph: TracedGraph) -> dict[str, int]:
    """Each parameter's position in the order the backward computes its gradient."""
    pos = {n: i for i, n in enumerate(graph.graph.nodes)}
    return {name: min(pos[t] for t in terms)
            for name, terms in graph.grad_terms().items() if terms}


def _unknown_reason(graphs: dict[tuple[int, ...], TracedGraph]) -> str:
    """Why no value can be judged against one device ('' when every value can)."""
    if any(graph_draws_random(g.graph) for g in graphs.values()):
        return ("the step draws random numbers: the ranks and the single device draw "
                "differently, so their values are not comparable")
    if any(_reads_rank_itself(g) for g in graphs.values()):
        return ("train_fn or the model reads the rank itself (joint.guards): the single-device "
                "step reads one rank's value, so its loss is not every rank's")
    return ""


def _reads_rank_itself(graph: TracedGraph) -> bool:
    """True when the user's code (not torch's DTensor) read the rank while traced."""
    return any(f.attr != "coordinate" for f in graph.assumptions.rank_facts())


def check_plan(graphs: dict[tuple[int, ...], TracedGraph], model: nn.Module,
               inputs: dict[str, Any], loss: dict[int, torch.Tensor],
               grads: dict[str, dict[int, torch.Tensor]], reference: nn.Module,
               train_fn: Callable[..., Any] | None = None) -> PlanCheck:
    """Compare every rank's loss and gathered gradients with one eager step on one device.

    Args:
        graphs: Rank class to the graph its ranks ran.
        model: The sharded model (its parameters' FQNs and placements).
        inputs: The keyword inputs the ranks ran on (the reference runs on them too).
        loss: Each rank's loss.
        grads: Each sharded parameter's full gradient on each rank.
        reference: The unsharded model on one device (not changed: copies run).
        train_fn: The training step (default: the traced graphs').

    Returns:
        A :class:`PlanCheck`.

    Raises:
        StateMismatchError: ``reference`` is not the unsharded model of ``model``, or
            no ``train_fn`` is known (a loaded graph).
    """
    first_graph = next(iter(graphs.values()))
    train_fn = train_fn or first_graph.train_fn
    if train_fn is None:
        raise StateMismatchError(
            "the plan check runs train_fn on the reference model, and this graph has none "
            "(a loaded or gathered graph): pass train_fn= to jl.run_all_ranks.")
    names = _reference_names(model, reference)
    eager, wide, failed = _reference_steps(reference, train_fn, inputs, list(names.values()))
    unknown = _unknown_reason(graphs)
    tol = Tolerance()
    notes = [f"beyond float32 tolerance (rtol {tol.bounds(eager.loss)[0]:g}) a value is "
             "judged by its distance to the reference run in float64: within "
             f"{ROUNDING_FACTOR:g}x float32 eager's own distance (plus the tolerance) it is "
             "rounding of another summation order"]
    if failed:
        notes.append(f"the float64 reference could not run ({failed}): values beyond float32 "
                     "tolerance are not known")
    if unknown:
        notes.append(f"not known: {unknown}")
    loss_rows = _loss_rows(loss, eager, wide, tol, unknown)
    grad_rows, order = _grad_rows(model, names, grads, eager, wide, tol, unknown), \
        _backward_order(first_graph)
    table = pd.DataFrame(grad_rows, columns=GRAD_COLUMNS)
    loss_table = pd.DataFrame(loss_rows, columns=LOSS_COLUMNS)
    first = _first(grad_rows, order, names)
    ok = _overall(r["ok"] for r in grad_rows + loss_rows)
    verdict = {True: "matches one device", False: "DIFFERS from one device",
               None: "not known"}[ok]
    return PlanCheck(ok, verdict, first, loss_table, table, tuple(notes))


def _loss_rows(loss: dict[int, torch.Tensor], eager: EagerCapture, wide: EagerCapture | None,
               tol: Tolerance, unknown: str) -> list[dict[str, Any]]:
    rows = []
    for rank, value in loss.items():
        ok, rel, _ = _judge(value, eager.loss, None if wide is None else wide.loss, tol)
        rows.append({"rank": rank, "loss": float(value), "reference": float(eager.loss),
                     "rel_err": rel, "ok": None if unknown else ok,
                     "note": "" if ok is not None else "no float64 reference"})
    return rows


def _grad_rows(model: nn.Module, names: dict[str, str], grads: dict[str, dict[int, torch.Tensor]],
               eager: EagerCapture, wide: EagerCapture | None, tol: Tolerance, unknown: str
               ) -> list[dict[str, Any]]:
    """One row per parameter, in the reference's module order."""
    params = dict(model.named_parameters())
    rows = {}
    for fqn, ref_name in names.items():
        want = eager.grads.get(ref_name)
        values = grads.get(fqn)
        if want is None:
            want = torch.zeros_like(params[fqn].full_tensor() if is_dtensor(params[fqn])
                                    else params[fqn]).detach()
        note = ""
        if values is None:  # the graph has no gradient for it: zero on every rank
            values, note = {0: torch.zeros_like(want)}, "no gradient in the graph (zero)"
        w64 = None if wide is None else wide.grads.get(ref_name)
        if w64 is None and wide is not None:  # no gradient in float64 either: exactly zero
            w64 = torch.zeros_like(want, dtype=torch.float64)
        ok, rel, max_abs, bad = _judge_ranks(values, want, w64, tol)
        if ok is None and not note:
            note = "beyond float32 tolerance; no float64 reference to tell rounding apart"
        rows[ref_name] = {"param": ref_name, "module": ref_name.rpartition(".")[0],
                          "placement": _placement(params[fqn]), "rel_err": rel,
                          "max_abs_err": max_abs, "ranks": bad,
                          "ok": None if unknown else ok, "note": note}
    return [rows[n] for n in eager.grads if n in rows]


def _first(rows: list[dict[str, Any]], order: dict[str, int], names: dict[str, str]
           ) -> GradientDifference | None:
    """The differing parameter the backward computes first (module order breaks ties)."""
    graph_pos = {names_ref: order.get(fqn, len(order) + i)
                 for i, (fqn, names_ref) in enumerate(names.items())}
    bad = [(graph_pos.get(r["param"], 1 << 30), i, r) for i, r in enumerate(rows)
           if r["ok"] is False]
    if not bad:
        return None
    _, _, row = min(bad, key=lambda t: (t[0], t[1]))
    return GradientDifference(row["param"], row["module"], row["rel_err"], row["max_abs_err"],
                              row["ranks"])
