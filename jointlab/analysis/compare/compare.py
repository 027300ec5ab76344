"""``compare``: run the joint graph and eager autograd from the same start, side by side.

Each side gets its own deep copy of the model and the same RNG seed, so
dropout draws the same masks and neither side changes the user's model. The
result, a :class:`Comparison`, holds the loss, per-parameter gradient errors,
the loss_dict, the buffers after the step, and ``first_divergence``: the first
graph node, in graph order, whose value differs from the eager value at the
same point. Graph values are paired with eager ones through the tracer's
probes (:mod:`jointlab.trace.probes`): the graph node that *is* a module call's
output, or that output's gradient, as recorded while tracing.

Verdicts come in three grades: ``bit-exact`` (every compared value is bitwise
equal), ``within tolerance`` (with the reasons a difference is expected, e.g.
low-precision compute) and ``MISMATCH``. Default tolerances follow the
lowest-precision dtype the graph computes in and scale with each tensor's
magnitude, so gradients of 1e-3 are judged relative to their own size.
A compiled joint (``joint.compile()``) is compared as well as the graph it
came from, so "inductor vs graph vs eager" is one call.
"""

from __future__ import annotations

import copy
import dataclasses
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
import torch.fx as fx
from torch import nn

from jointlab import meta as _meta
from jointlab.analysis.compare.capture import (
    EagerCapture,
    Probe,
    capture_eager,
    probe_pairs,
    to_device,
)
from jointlab.analysis.compare.layout import layout_drift, uncertain_layout_nodes
from jointlab.analysis.step.runner import NodeRunner, check_call
from jointlab.core import RunResult, TracedGraph
from jointlab.display import rich_html
from jointlab.errors import CompareError
from jointlab.meta import op_name
from jointlab.trace.refusals import torch_errors

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Comparison", "Divergence", "Tolerance", "compare", "default_tolerances"]

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
    on one device, computing in float32/float64, without order-dependent ops.
    """
    return (joint.mode == "make_fx" and len(devices) == 1
            and compute_dtype(joint) in (torch.float32, torch.float64, None)
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


@dataclass(frozen=True)
class Divergence:
    """The first graph node whose value differs from eager."""

    node: str
    module: str
    source: str
    phase: str
    what: str  # "module output", "output gradient", "parameter gradient", "loss"
    max_abs_err: float
    max_rel_err: float = 0.0

    def __repr__(self) -> str:
        """``Divergence(<one line>)``: node, what, module, phase, source and errors."""
        return f"Divergence({self})"

    def __str__(self) -> str:
        """One line naming node, the module the value belongs to, and source."""
        what = (f"the loss, computed in {self.module}" if self.what == "loss"
                else f"{self.what} of module '{self.module or '(root)'}'")
        return (f"{self.node} ({what}, {self.phase}, "
                f"{self.source or 'no source'}): max abs err {self.max_abs_err:.3g}, "
                f"max rel err {self.max_rel_err:.3g}")


# -- numeric comparison ----------------------------------------------------------
def errors(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    """Return ``(max abs err, max rel err, cosine similarity)`` of ``a`` against ``b``."""
    if a.shape != b.shape:
        return float("inf"), float("inf"), float("nan")
    x, y = a.detach().double().flatten().cpu(), b.detach().double().flatten().cpu()
    if x.numel() == 0:
        return 0.0, 0.0, 1.0
    diff = (x - y).abs()
    abs_err = float(diff.max())
    rel_err = float((diff / y.abs().clamp_min(1e-12)).max())
    denom = float(x.norm() * y.norm())
    cos = float(x @ y) / denom if denom > 0 else (1.0 if abs_err == 0 else 0.0)
    return abs_err, rel_err, cos


def bit_exact(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` are bitwise the same values (NaN where eager has NaN)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.to(b.device), b) or
                (a.is_floating_point() and torch.isclose(a.to(b.device), b, 0.0, 0.0,
                                                         equal_nan=True).all()))


def close(a: Any, b: Any, tol: Tolerance) -> bool:
    """True when ``a`` matches eager value ``b`` under ``tol``."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return a == b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point() and not a.is_complex():
        return bool(torch.equal(a.to(b.device), b))
    rtol, atol = tol.bounds(b)
    return bool(torch.isclose(a.to(b.device), b, rtol=rtol, atol=atol, equal_nan=True).all())


def _rows(pairs: dict[str, tuple[Any, Any]], tol: Tolerance, candidate: str) -> list[dict]:
    rows = []
    for name, (got, want) in pairs.items():
        if want is None:  # eager has no gradient: graph must emit zeros
            want = torch.zeros_like(got)
        abs_err, rel_err, cos = errors(got, want)
        rows.append({"candidate": candidate, "name": name, "shape": tuple(got.shape),
                     "dtype": str(got.dtype).removeprefix("torch."), "max_abs_err": abs_err,
                     "max_rel_err": rel_err, "cosine": cos, "exact": bit_exact(got, want),
                     "ok": close(got, want, tol)})
    return rows


# -- running the candidates ------------------------------------------------------
@runtime_checkable
class CompiledCandidate(Protocol):
    """A compiled joint graph: :class:`jointlab.CompiledJoint` satisfies it."""

    source: TracedGraph
    backend: str

    def run(self, model: nn.Module, inputs: dict[str, Any]) -> RunResult:
        """One step through the compiled code."""


def _candidates(joint: Any) -> dict[str, Any]:
    items = joint if isinstance(joint, (list, tuple)) else [joint]
    out: dict[str, Any] = {}
    for j in items:
        if isinstance(j, CompiledCandidate):
            out[j.backend] = j
            out.setdefault("graph", j.source)
        else:
            out["graph" if "graph" not in out else f"graph{len(out)}"] = j
    return out


def _checked_args(joint: Any, model: Any, inputs: Any, seed: Any, device: Any, train_fn: Any
                  ) -> tuple[dict[str, Any], Any, torch.device]:
    """Validate ``compare``'s arguments: ``(candidates, train_fn, device)``.

    Raises:
        CompareError: An argument is of the wrong kind, or no training step is known.
    """
    if isinstance(joint, (list, tuple)) and not joint:
        raise CompareError("jl.compare got an empty list: pass a joint graph, a compiled one "
                           "(joint.compile()), or a list of them")
    cands = _candidates(joint)
    graph = cands.get("graph")
    for cand in cands.values():
        if cand is not graph and not isinstance(cand, CompiledCandidate):
            raise CompareError(f"jl.compare cannot run a {type(cand).__name__}: pass joint "
                               "graphs from jl.trace or compiled ones (joint.compile())")
    check_call(graph, model, inputs, CompareError, "jl.compare")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise CompareError(f"jl.compare: seed must be an int, got {seed!r}")
    train_fn = train_fn or getattr(graph, "train_fn", None)
    if train_fn is None:
        raise CompareError("compare needs the training step: pass train_fn=..., or use a "
                           "joint graph that records it (joint.train_fn)")
    if not callable(train_fn):
        raise CompareError(f"jl.compare: train_fn must be callable, got {type(train_fn).__name__}")
    try:
        dev = torch.device(device) if device is not None else next(model.parameters()).device
    except (RuntimeError, TypeError) as exc:
        raise CompareError(f"jl.compare: device={device!r} is not a torch device") from exc
    except StopIteration as exc:
        raise CompareError("jl.compare: the model has no parameters to compare") from exc
    graph.flat_args(model, inputs)  # the graph's own checks: structure, shapes, state
    return cands, train_fn, dev


def _run_graph(joint: TracedGraph, model: nn.Module, inputs: dict[str, Any], seed: int,
               device: torch.device, keep: set[str]
               ) -> tuple[RunResult, dict[str, torch.Tensor], NodeRunner]:
    runner = NodeRunner(joint, copy.deepcopy(model), inputs, device=device, seed=seed, keep=keep)
    runner.advance(len(runner.nodes))
    return runner.result, runner.buffers(), runner


def _run_compiled(compiled: Any, model: nn.Module, inputs: dict[str, Any], seed: int,
                  device: torch.device):
    m = copy.deepcopy(model).to(device)
    inp = to_device(inputs, device)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        out = compiled.run(m, inp)
    return out, dict(m.named_buffers())


@torch_errors("jl.compare")
def compare(joint: Any, model: nn.Module, inputs: dict[str, Any], *, seed: int = 0,
            rtol: float | None = None, atol: float | None = None, exact: bool | None = None,
            device: str | torch.device | None = None, train_fn: Any = None) -> Comparison:
    """Run the joint graph and eager autograd from the same state and seed, and compare.

    Args:
        joint: A TracedGraph, a compiled one (``joint.compile()``), or a list of them.
        model: The user's model (never changed: each side runs on a deep copy).
        inputs: Keyword inputs for ``train_fn``.
        seed: RNG seed used by both sides (every random op draws exactly what eager draws).
        rtol: Relative tolerance; default follows the graph's lowest compute dtype.
        atol: Absolute tolerance; default is a dtype-dependent fraction of each
            tensor's largest magnitude.
        exact: Demand bitwise equality (True), judge by tolerances (False), or
            (None, the default) demand it exactly where both sides run the same
            kernels: a make_fx graph on one device in float32/64 without ops
            whose accumulation order varies (see :func:`expects_exact`), and
            whose real strides stayed the traced ones (see
            :func:`jointlab.analysis.compare.layout.layout_drift`).
            Explicit ``rtol``/``atol`` imply tolerances.
        device: Run both sides here; default: where the model lives.
        train_fn: The training step; default ``joint.train_fn``.

    Returns:
        A :class:`Comparison`.

    Raises:
        jointlab.errors.CompareError: An argument is of the wrong kind, or no training
            step is known for ``joint``.
        jointlab.errors.InputStructureError: ``inputs`` differ from what was traced
            (and the other checks of ``joint.run``).
    """
    cands, train_fn, dev = _checked_args(joint, model, inputs, seed, device, train_fn)
    graph = cands["graph"]
    eager_model = copy.deepcopy(model).to(dev)
    eager = capture_eager(eager_model, train_fn, to_device(inputs, dev), graph.param_names,
                          seed=seed)
    del eager_model
    probes, unpaired = probe_pairs(graph.graph, eager)
    defaulted = exact is None
    if exact is None:
        exact = rtol is None and atol is None and expects_exact(graph, {dev.type})
    results: dict[str, tuple] = {}
    runner = None
    for name, cand in cands.items():
        if cand is graph:
            keep = {p.node.name for p in probes} | set(uncertain_layout_nodes(graph))
            out, bufs, runner = _run_graph(graph, model, inputs, seed, dev, keep)
        else:
            out, bufs = _run_compiled(cand, model, inputs, seed, dev)
        results[name] = (out, bufs)
    drift = layout_drift(graph, runner) if runner is not None else []
    exact = exact and not (defaulted and drift)
    tol = Tolerance(rtol, atol, exact, compute_dtype(graph))
    loose = Tolerance(rtol, atol, False, tol.floor)  # compiled candidates: other kernels
    checks = divergence_checks(graph, eager, probes)
    first = first_divergence(graph, runner, checks, tol)
    inexact = first_divergence(graph, runner, checks, Tolerance(exact=True))
    notes = _drift_notes(drift) + tol.reasons(graph, {dev.type})
    if exact and first is not None and close_by_dtype(runner, graph, checks, first, loose):
        notes.append(f"{first.node} differs by max rel err {first.max_rel_err:.3g}, within "
                     "dtype tolerance: a reordered reduction would look like this too, so "
                     "check it, or pass exact=False to judge by tolerance")
    tols = {name: tol if cand is graph else loose for name, cand in cands.items()}
    comp = Comparison.build(results, eager, first, inexact, tols, notes, unpaired)
    compiled = [n for n, c in cands.items() if c is not graph]
    if compiled and not _compiled_exact(comp, compiled):
        ref = fp64_reference(model, train_fn, inputs, graph.param_names, seed, dev)
        comp = dataclasses.replace(comp, fp64=fp64_table(results, eager, ref, compiled))
        comp = accept_by_fp64(comp, eager, loose)
    kernels = {name: cands[name].first_diverging_kernel(model, inputs, loose, seed)
               for name in compiled if not _candidate_ok(comp, name)
               and hasattr(cands[name], "first_diverging_kernel")}
    return dataclasses.replace(comp, kernels=kernels) if kernels else comp


def accept_by_fp64(comp: Comparison, eager: EagerCapture, tol: Tolerance) -> Comparison:
    """Accept compiled values that are off eager but no farther from float64 than eager is.

    A compiled loss or gradient beyond tolerance of eager is accepted when its max abs
    distance to the float64 reference is at most eager's own distance plus eager's
    absolute tolerance: the difference is then eager's rounding, not a compiler bug
    (a gradient that is zero in exact arithmetic, such as an attention key bias, is
    fp32 rounding noise on both sides). Each accepted value is named in the notes.

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
            if key not in fp64.index or not isinstance(want, torch.Tensor):
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


def _candidate_ok(comp: Comparison, name: str) -> bool:
    rows = [t[t["candidate"] == name] for t in (comp.loss, comp.grads, comp.loss_dict,
                                                comp.buffers) if len(t)]
    return all(bool(r["ok"].all()) for r in rows)


def _drift_notes(drift: list[str]) -> list[str]:
    if not drift:
        return []
    return [f"real strides differ from the traced ones at {', '.join(drift[:3])}"
            f"{f' and {len(drift) - 3} more' if len(drift) > 3 else ''}: composite ops "
            "after them (linear, matmul) may take another kernel in eager than the trace "
            "recorded, so values are judged by dtype tolerance, not bitwise"]


def _compiled_exact(comp: Comparison, names: list[str]) -> bool:
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

    Returns:
        The float64 eager capture.
    """
    m = copy.deepcopy(model).to(device).double()
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


def close_by_dtype(runner: NodeRunner, joint: TracedGraph, checks: list, first: Divergence,
                   tol: Tolerance) -> bool:
    """True when the first (exact) divergence would pass the dtype tolerances."""
    for node, want, _what, _owner in checks:
        if node.name == first.node:
            got = runner.lookup(node)
            if isinstance(got, torch.Tensor) and got.numel() == want.numel():
                return close(got, want.reshape(got.shape), tol)
    return False


def divergence_checks(joint: TracedGraph, eager: EagerCapture,
                      probes: list[Probe]) -> list[tuple[fx.Node, torch.Tensor, str, str]]:
    """Every ``(graph node, eager value, what, module)`` to check, in graph order."""
    checks = [(p.node, p.want, p.what, p.module) for p in probes]
    # A parameter's gradient node holds its full gradient only when it is the
    # sole one; tied aliases in AOT mode each carry a partial gradient.
    for name, terms in joint.grad_terms().items():
        want = eager.grads.get(name)
        if len(terms) == 1 and want is not None:
            checks.append((terms[0], want, "parameter gradient", name.rpartition(".")[0]))
    loss_node = joint.outputs_and_tangents()[0][0]  # the loss, in either mode's layout
    if isinstance(loss_node, fx.Node):
        checks.append((loss_node, eager.loss, "loss", _meta.TRAIN_FN))
    order = {n: i for i, n in enumerate(joint.graph.nodes)}
    checks.sort(key=lambda x: order[x[0]])
    return checks


def first_divergence(joint: TracedGraph, runner: NodeRunner, checks: list, tol: Tolerance
                     ) -> Divergence | None:
    """The first checked graph node, in graph order, whose value differs from eager."""
    for node, want, what, owner in checks:
        got = runner.lookup(node)
        if isinstance(got, torch.Tensor) and got.shape != want.shape \
                and got.numel() == want.numel():
            want = want.reshape(got.shape)
        if got is None or close(got, want, tol):
            continue
        info = _meta.info(node)
        abs_err, rel_err, _ = errors(got, want)
        return Divergence(node.name, owner, info.get("source", ""), info.get("phase", ""),
                          what, abs_err, rel_err)
    return None


# -- the result -------------------------------------------------------------------
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

    @classmethod
    def build(cls, results: dict[str, tuple], eager: EagerCapture, first: Divergence | None,
              inexact: Divergence | None, tols: dict[str, Tolerance], notes: list[str],
              unchecked: list[str]) -> Comparison:
        """Assemble the tables from each candidate's ``(outputs, buffers)``."""
        loss_rows, grad_rows, ld_rows, buf_rows = [], [], [], []
        for name, ((loss, grads, ld), bufs) in results.items():
            tol = tols[name]
            loss_rows += _rows({"loss": (loss, eager.loss)}, tol, name)
            loss_rows[-1].update(value=float(loss), eager=float(eager.loss))
            grad_rows += _rows({k: (g, eager.grads[k]) for k, g in grads.items()}, tol, name)
            ld_rows += _rows({k: (v, eager.loss_dict[k]) for k, v in ld.items()
                              if isinstance(v, torch.Tensor)}, tol, name)
            buf_rows += _rows({k: (v, eager.buffers[k]) for k, v in bufs.items()
                               if k in eager.buffers}, tol, name)
        tables = [_frame(r) for r in (loss_rows, grad_rows, ld_rows, buf_rows)]
        ok = all(bool(t["ok"].all()) for t in tables if len(t)) and first is None
        exact = ok and inexact is None and all(bool(t["exact"].all()) for t in tables if len(t))
        verdict = "bit-exact" if exact else "within tolerance" if ok else "MISMATCH"
        return cls(ok, exact, verdict, *tables, first, None if exact else inexact,
                   tuple(notes), tuple(unchecked))

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
