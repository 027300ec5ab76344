"""Where the graph's values diverge from eager's; a compiled candidate's MISMATCH named.

:func:`divergence_checks` lists every ``(graph node, eager value)`` pair to
check in graph order (probed module outputs and their gradients, sole-term
parameter gradients, input gradients, the loss); :func:`first_divergence`
finds the first beyond tolerance; :func:`close_by_dtype` says whether an exact
divergence would pass the dtype tolerances. :func:`name_compiled_divergence`
names the first divergence of a compiled candidate: its first diverging
kernel, else the first traced op whose value after Inductor's decompositions
differs, else its first loss or gradient beyond tolerance.
:func:`jointlab.analysis.compare.compare.compare` uses them all.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from jointlab import meta as _meta
from jointlab.analysis.compare.judge import Tolerance, close, errors
from jointlab.analysis.compare.result import Comparison, Divergence
from jointlab.analysis.compare.scale import produced_scale

if TYPE_CHECKING:
    from jointlab.analysis.compare.capture import EagerCapture, Probe
    from jointlab.analysis.step.runner import NodeRunner
    from jointlab.core import TracedGraph

__all__ = ["close_by_dtype", "divergence_checks", "first_divergence",
           "name_compiled_divergence", "value_nodes"]


def value_nodes(joint: TracedGraph) -> dict[tuple[str, str], fx.Node]:
    """The loss node and each sole-term parameter gradient node, by ``(table, name)``.

    Args:
        joint: The traced joint graph.

    Returns:
        ``("loss", "loss")``, ``("grads", FQN)`` and ``("input_grads", path)`` -> its node.
    """
    out = {("grads", name): terms[0] for name, terms in joint.grad_terms().items()
           if len(terms) == 1}
    out.update({("input_grads", path): node for path, node in _input_grad_nodes(joint)})
    loss = joint.outputs_and_tangents()[0][0]
    if isinstance(loss, fx.Node):
        out[("loss", "loss")] = loss
    return out


def _input_grad_nodes(joint: TracedGraph) -> list[tuple[str, fx.Node]]:
    """``(input path, gradient node)`` of each input whose gradient the graph computes."""
    return [(_meta.info(ph)["input_path"], g) for ph, g in joint.inputs_and_grads()
            if g is not None and _meta.info(ph).get("phase") == "input"]


def name_compiled_divergence(comp: Comparison, joint: TracedGraph,
                             compiled: list[str]) -> Comparison:
    """A MISMATCH of a compiled candidate only, with ``first_divergence`` naming it.

    The first diverging kernel where the kernel-by-kernel check found one; where
    every kernel matched Inductor's post-grad graph (the bug arose before
    lowering), the first traced op whose post-grad value differs; else the
    first loss or gradient (in graph order) beyond tolerance.
    """
    if comp.ok or comp.first_divergence is not None:
        return comp
    for name in compiled:
        check = (comp.kernels or {}).get(name)
        if check is not None and check.first is not None:
            return dataclasses.replace(comp, first_divergence=_kernel_divergence(
                joint, name, check.first))
        if (op := getattr(check, "decomposed", None)) is not None:
            return dataclasses.replace(comp, first_divergence=_decomposed_divergence(
                joint, name, op))
        if (found := _first_bad_value(comp, joint, name)) is not None:
            return dataclasses.replace(comp, first_divergence=found)
    return comp


def _kernel_divergence(joint: TracedGraph, candidate: str, k: Any) -> Divergence:
    """The diverging kernel ``k`` named at the traced op whose result its buffer holds.

    ``k.node`` is a node of Inductor's post-grad graph, whose names are its own
    (a post-grad ``mul_23`` is not the traced ``mul_23``): the traced node comes
    from Inductor's provenance (``k.traced``), else the kernel's first node.
    """
    by_name = {n.name: n for n in joint.graph.nodes}
    traced = getattr(k, "traced", "")
    node = traced if traced in by_name else next(iter(k.nodes), k.node)
    info = _meta.info(by_name[node]) if node in by_name else {}
    if traced in by_name:
        return Divergence(node, info.get("module", ""), info.get("source", ""),
                          info.get("phase", ""), "kernel output", k.max_abs_err,
                          k.max_rel_err, candidate=candidate, kernel=k.kernel)
    return Divergence(node, k.modules[0] if k.modules else info.get("module", ""),
                      info.get("source", "") or next(iter(k.sources), ""),
                      info.get("phase", ""), "kernel output", k.max_abs_err, k.max_rel_err,
                      candidate=candidate, kernel=k.kernel)


def _decomposed_divergence(joint: TracedGraph, candidate: str, op: Any) -> Divergence:
    """``op`` (a :class:`jointlab.analysis.kernel_probe.DecomposedDivergence`) as a Divergence."""
    info = _meta.info(next(n for n in joint.graph.nodes if n.name == op.node))
    return Divergence(op.node, info.get("module", ""), info.get("source", ""),
                      info.get("phase", ""), "output after Inductor's decompositions",
                      op.max_abs_err, op.max_rel_err, candidate=candidate)


def _first_bad_value(comp: Comparison, joint: TracedGraph, candidate: str
                     ) -> Divergence | None:
    order = {n.name: i for i, n in enumerate(joint.graph.nodes)}
    nodes = value_nodes(joint)
    bad = []
    for table in ("loss", "grads", "input_grads"):
        t = getattr(comp, table)
        for _, row in t[(t["candidate"] == candidate) & ~t["ok"].astype(bool)].iterrows():
            node = nodes.get((table, row["name"]))
            if node is not None:
                bad.append((order[node.name], node, table, row))
    if not bad:
        return None
    _, node, table, row = min(bad, key=lambda b: b[0])
    info = _meta.info(node)
    owner = _meta.TRAIN_FN if table != "grads" else row["name"].rpartition(".")[0]
    what = {"loss": "loss", "grads": "parameter gradient"}.get(table, "input gradient")
    return Divergence(node.name, owner, info.get("source", ""), info.get("phase", ""), what,
                      row["max_abs_err"], row["max_rel_err"], candidate=candidate,
                      input=row["name"] if table == "input_grads" else "")


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
    for path, node in _input_grad_nodes(joint):
        if (want := eager.input_grads.get(path)) is not None:
            checks.append((node, want, "input gradient", _meta.TRAIN_FN))
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
        if not tol.exact and close(got, want, tol, produced_scale(node, runner.lookup)):
            continue  # within tolerance of the magnitudes that produced it
        info = _meta.info(node)
        abs_err, rel_err, _ = errors(got, want)
        return Divergence(node.name, owner, info.get("source", ""), info.get("phase", ""),
                          what, abs_err, rel_err, input=info.get("input_grad_of") or "")
    return None
