"""``compare``: run the joint graph and eager autograd from the same start, side by side.

Both sides start from the same state and RNG seed, so dropout draws the same masks.
Eager autograd runs on the user's model itself, as the user holds it (parameter and
module hooks, globals, swapped modules), and leaves it exactly as it was
(:func:`jointlab.runtime.kept.model_kept`); only a run on another device needs a copy,
which carries the parameters' hooks (:func:`jointlab.runtime.kept.hooked_copy`). The
graph reads the model's state and updates its own copies of the buffers. The result, a
:class:`Comparison`, holds the loss, per-parameter gradient errors, the loss_dict, the
buffers after the step, and ``first_divergence``: the first graph node, in graph order,
whose value differs from the eager value at the same point. Graph values are paired with
eager ones through the tracer's probes (:mod:`jointlab.trace.probe_hooks`): the graph node
that *is* a module call's output, or that output's gradient, as recorded while tracing.

Verdicts come in three grades: ``bit-exact`` (every compared value is bitwise equal),
``within tolerance`` (with the reasons a difference is expected, e.g. low-precision
compute) and ``MISMATCH``. Default tolerances follow the lowest-precision dtype the
graph computes in and scale with each tensor's magnitude, so gradients of 1e-3 are
judged relative to their own size; a loss or gradient is also judged relative to the
magnitudes that produced it (:mod:`jointlab.analysis.compare.scale`), so the rounding
noise of a gradient that is zero in exact arithmetic (an attention key bias) is no
mismatch. On a MISMATCH of a compiled candidate alone, ``first_divergence`` names its
first diverging kernel; where every kernel matches Inductor's post-grad graph (the
bug arose before lowering: a decomposition or graph pass), the first traced op whose
value after Inductor's decompositions differs
(:func:`jointlab.analysis.kernel_probe.first_decomposed_divergence`); else its first
value beyond tolerance. A compiled joint
(``joint.compile()``) is compared as well as the graph it came from, so "inductor vs
graph vs eager" is one call.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from jointlab.analysis.compare.capture import (
    EagerCapture,
    capture_eager,
    local_values,
    placement_mismatches,
    probe_pairs,
    settle_points,
    to_device,
)
from jointlab.analysis.compare.divergence import (
    close_by_dtype,
    divergence_checks,
    first_divergence,
    name_compiled_divergence,
    value_nodes,
)
from jointlab.analysis.compare.fp64 import (
    candidate_ok,
    compiled_exact,
    fp64_reference,
    fp64_table,
)
from jointlab.analysis.compare.judge import Tolerance as Tolerance
from jointlab.analysis.compare.judge import compute_dtype, expects_exact
from jointlab.analysis.compare.judge import default_tolerances as default_tolerances
from jointlab.analysis.compare.random_ops import blame_random_op, random_nodes, referee_fp64
from jointlab.analysis.compare.result import Comparison as Comparison
from jointlab.analysis.compare.result import Divergence as Divergence
from jointlab.analysis.compare.scale import produced_scale, scale_reads
from jointlab.analysis.compare.stride_drift import layout_drift, uncertain_layout_nodes
from jointlab.analysis.step.runner import NodeRunner, check_call
from jointlab.core import RunResult, TracedGraph
from jointlab.errors import CompareError
from jointlab.runtime.dtensor import is_dtensor
from jointlab.runtime.kept import model_on
from jointlab.runtime.torch_errors import torch_errors

__all__ = ["Comparison", "Divergence", "Tolerance", "compare", "default_tolerances"]

_COMPARE_HINT = (
    "jl.compare runs train_fn eagerly (torch.autograd.grad of the loss with respect to the "
    "parameters that require grad) and the graph on the model as it is now. If you changed the "
    "model since jl.trace (requires_grad, train()/eval(), a submodule, a hyperparameter), trace "
    "it again with jl.trace; if train_fn fails at that line, fix it so that it runs eagerly on "
    "these inputs")


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
               device: torch.device, keep: set[str], settle: dict[str, str] | None = None
               ) -> tuple[RunResult, dict[str, torch.Tensor], NodeRunner]:
    runner = NodeRunner(joint, model, inputs, device=device, seed=seed, keep=keep,
                        settle=settle)  # clones buffers
    runner.advance(len(runner.nodes))
    return runner.result, runner.buffers(), runner


def _run_compiled(compiled: Any, model: nn.Module, inputs: dict[str, Any], seed: int,
                  device: torch.device):
    inp = to_device(inputs, device)
    devices = [device] if device.type == "cuda" else []
    with model_on(model, device) as m, torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        out = compiled.run(m, inp)
        return out, {k: v.detach().clone() for k, v in m.named_buffers()}


@torch_errors("jl.compare", hint=_COMPARE_HINT)
def compare(joint: Any, model: nn.Module, inputs: dict[str, Any], *, seed: int = 0,
            rtol: float | None = None, atol: float | None = None, exact: bool | None = None,
            device: str | torch.device | None = None, train_fn: Any = None) -> Comparison:
    """Run the joint graph and eager autograd from the same state and seed, and compare.

    Args:
        joint: A TracedGraph, a compiled one (``joint.compile()``), or a list of them.
        model: The user's model. Eager runs on it as it is (hooks and all) and it is
            left exactly as it was: values, gradients, flags, plain attributes, RNG.
        inputs: Keyword inputs for ``train_fn``.
        seed: RNG seed used by both sides (every random op draws exactly what eager draws).
        rtol: Relative tolerance; default follows the graph's lowest compute dtype.
        atol: Absolute tolerance; default is a dtype-dependent fraction of each
            tensor's largest magnitude.
        exact: Demand bitwise equality (True), judge by tolerances (False), or
            (None, the default) demand it exactly where both sides run the same
            kernels: a make_fx graph on one device, in any dtype, without ops
            whose accumulation order varies (see :func:`expects_exact`), and
            whose real strides stayed the traced ones (see
            :func:`jointlab.analysis.compare.stride_drift.layout_drift`).
            Explicit ``rtol``/``atol`` imply tolerances.
        device: Run both sides here; default: where the model lives. When the
            model is elsewhere, eager runs on a copy on ``device`` that carries the
            parameters' hooks but not code that refers to the user's own objects
            (see :func:`jointlab.runtime.kept.hooked_copy`).
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
    with model_on(model, dev) as eager_model:
        eager = capture_eager(eager_model, train_fn, to_device(inputs, dev), graph.param_names,
                              seed=seed, input_paths=_grad_inputs(graph))
    probes, unpaired = probe_pairs(graph.graph, eager)
    defaulted = exact is None
    if exact is None:
        exact = rtol is None and atol is None and expects_exact(graph, {dev.type})
    compiled = [n for n, c in cands.items() if c is not graph]
    results: dict[str, tuple] = {}
    runner = None
    for name, cand in cands.items():
        if cand is graph:
            keep = {p.node.name for p in probes} | set(uncertain_layout_nodes(graph))
            if compiled or not exact:  # what the scale of each loss and gradient reads
                keep |= {r for n in value_nodes(graph).values() for r in scale_reads(n)}
            out, bufs, runner = _run_graph(graph, model, inputs, seed, dev, keep,
                                           settle_points(probes))
        else:
            out, bufs = _run_compiled(cand, model, inputs, seed, dev)
        results[name] = (out, bufs)
    results, eager, shard_note = _local_shards(results, eager)
    drift = layout_drift(graph, runner) if runner is not None else []
    exact = exact and not (defaulted and drift)
    tol = Tolerance(rtol, atol, exact, compute_dtype(graph))
    loose = Tolerance(rtol, atol, False, tol.floor)  # compiled candidates: other kernels
    checks = divergence_checks(graph, eager, probes)
    first = first_divergence(graph, runner, checks, tol)
    inexact = first_divergence(graph, runner, checks, Tolerance(exact=True))
    notes = shard_note + _drift_notes(drift) + _judged_notes(tol, graph, dev, compiled)
    if exact and first is not None and close_by_dtype(runner, graph, checks, first, loose):
        notes.append(f"{first.node} differs by max rel err {first.max_rel_err:.3g}, within "
                     "dtype tolerance: a reordered reduction would look like this too, so "
                     "check it, or pass exact=False to judge by tolerance")
    tols = {name: tol if cand is graph else loose for name, cand in cands.items()}
    comp = Comparison.build(results, eager, first, inexact, tols, notes, unpaired,
                            _scale_of(graph, runner))
    if compiled and not compiled_exact(comp, compiled):
        ref = fp64_reference(model, train_fn, inputs, graph.param_names, seed, dev)
        comp = dataclasses.replace(comp, fp64=fp64_table(results, eager, ref, compiled))
        comp = referee_fp64(comp, eager, loose, graph)  # not downstream of random ops
    kernels = {name: cands[name].first_diverging_kernel(model, inputs, loose, seed)
               for name in compiled if not candidate_ok(comp, name)
               and hasattr(cands[name], "first_diverging_kernel")}
    comp = dataclasses.replace(comp, kernels=kernels) if kernels else comp
    comp = name_compiled_divergence(comp, graph, compiled)
    return blame_random_op(comp, graph, random_nodes(graph.graph))


def _judged_notes(tol: Tolerance, graph: TracedGraph, dev: torch.device,
                  compiled: list[str]) -> list[str]:
    """What each candidate was held to: the graph's reasons, then the compiled code's."""
    notes = tol.reasons(graph, {dev.type})
    if not compiled:
        return notes
    if tol.exact and expects_exact(graph, {dev.type}):
        notes = ["the graph: it runs the same ATen kernels as eager on the same device, so "
                 "it is held to bitwise equality (exact=False judges it by dtype tolerances)"]
    else:
        notes = [f"the graph: {n}" for n in notes]
    return [*notes, f"{', '.join(compiled)}: compiled code runs kernels of its own (fused, "
            "reductions reordered), so it is judged by dtype tolerances relative to the "
            "magnitudes that produced each value, never bitwise"]


def _grad_inputs(joint: TracedGraph) -> list[str]:
    """Paths of the inputs traced with ``requires_grad=True`` (eager differentiates them)."""
    return [leaf.path for leaf in joint.input_spec.tensor_leaves if leaf.requires_grad]


def _scale_of(joint: TracedGraph, runner: NodeRunner | None) -> Any:
    """``scale(table, name)``: the magnitudes that produced that loss or gradient (or None)."""
    nodes = value_nodes(joint)

    def scale(table: str, name: str) -> torch.Tensor | None:
        node = nodes.get((table, name))
        if node is None or runner is None:
            return None
        return produced_scale(node, runner.lookup)
    return scale


def _local_shards(results: dict[str, tuple], eager: EagerCapture
                  ) -> tuple[dict[str, tuple], EagerCapture, list[str]]:
    """Both sides as this rank's local tensors (DTensor state), placements checked.

    Returns:
        The results and the capture with local tensors, and a note when there
        were DTensors (empty otherwise).

    Raises:
        CompareError: A gradient is placed differently by the graph and by eager.
    """
    for (out, _bufs) in results.values():
        if bad := placement_mismatches(out.grads, eager.grads):
            raise CompareError(
                f"jl.compare: the graph and eager place these gradients differently: "
                f"{', '.join(bad)}, so their local shards are not the same values. "
                "Compare after gathering them (jl.run_all_ranks checks full tensors).")
    local = dataclasses.replace(eager, loss=local_values(eager.loss),
                                grads=local_values(eager.grads),
                                loss_dict=local_values(eager.loss_dict),
                                buffers=local_values(eager.buffers))
    sharded = any(is_dtensor(g) for g in eager.grads.values())
    note = ["DTensor state: values are compared as this rank's local shards, both sides "
            "under the same process group (a fake one exchanges no real data); "
            "jl.run_all_ranks checks every rank's gathered values"] if sharded else []
    return {n: (RunResult(*local_values(tuple(out)), out.input_grads), local_values(bufs))
            for n, (out, bufs) in results.items()}, local, note


def _drift_notes(drift: list[str]) -> list[str]:
    if not drift:
        return []
    return [f"real strides differ from the traced ones at {', '.join(drift[:3])}"
            f"{f' and {len(drift) - 3} more' if len(drift) > 3 else ''}: composite ops "
            "after them (linear, matmul) may take another kernel in eager than the trace "
            "recorded, so values are judged by dtype tolerance, not bitwise"]
